#!/bin/bash
# SPDX-License-Identifier: GPL-2.0
# The device lifecycle seen through stock tools: rdma link add/delete, ibv_devices,
# ibv_devinfo, port state following the netdev, netdev removal, module unload with devices.
source "$(dirname "$0")/../lib.sh"
dmesg_mark

check "modprobe metaroce" modprobe metaroce
check_output "module is loaded" '^metaroce ' lsmod
check_output "modinfo has the rdma-link alias" 'alias:.*rdma-link-metaroce' modinfo metaroce

setup_pair metaroce mroce
check_output "rdma link (in ns1) shows mroce1 on veth1" 'link mroce1/1 .*state ACTIVE.*netdev veth1' $IP netns exec ns1 $RDMA link show
check_output "rdma dev shows mroce2" 'mroce2: node_type ca' $RDMA dev show
check_output "ibv_devices lists both devices" 'mroce1.*[0-9a-f]{16}' ibv_devices
check_output "ibv_devinfo: port active" 'state:[[:space:]]+PORT_ACTIVE' ibv_devinfo -d mroce1
check_output "ibv_devinfo: link layer Ethernet" 'link_layer:[[:space:]]+Ethernet' ibv_devinfo -d mroce1
check_output "ibv_devinfo: node GUID from the MAC (EUI-64)" 'node_guid:[[:space:]]+[0-9a-f]{4}:[0-9a-f]{2}ff:fe[0-9a-f]{2}:[0-9a-f]{4}' ibv_devinfo -d mroce1
check_output "ibv_devinfo -v: IPv4 RoCEv2 GID" 'GID\[ *[0-9]+\]:.*::ffff:10\.77\.0\.1, RoCE v2' ibv_devinfo -v -d mroce1
check_output "ibv_devinfo -v: IPv6 GID" 'GID\[ *[0-9]+\]:.*fd77::1, RoCE v2' ibv_devinfo -v -d mroce1
check_output "ibv_devinfo -v: active MTU below the netdev's" 'active_mtu:[[:space:]]+1024' ibv_devinfo -v -d mroce1
check_output "transport is InfiniBand verbs, uverbs device present" 'transport:[[:space:]]+InfiniBand' ibv_devinfo -d mroce2
check_output "rdma link add on the same netdev again fails" 'File exists|exist' sh -c "$IP netns exec ns1 $RDMA link add mroceX type metaroce netdev veth1 2>&1; true"

check_output "one port: a device has one per plane (planes.sh adds more)" '^1$' \
	sh -c "ibv_devinfo -d mroce1 | grep -cE '^[[:space:]]+port:'"

# Port state follows the netdev.
$IP -n ns1 link set veth1 down
check_output "netdev down: port DOWN" 'state:[[:space:]]+PORT_DOWN' ibv_devinfo -d mroce1
check_output "netdev down: phys state disabled" 'phys_state:[[:space:]]+DISABLED' ibv_devinfo -v -d mroce1
$IP -n ns1 link set veth1 up
wait_for 5 sh -c "ibv_devinfo -d mroce1 | grep -q PORT_ACTIVE"
check_output "netdev up again: port ACTIVE" 'state:[[:space:]]+PORT_ACTIVE' ibv_devinfo -d mroce1

# Removal through rdma tooling, then re-creation.
check "rdma link delete mroce1" $IP netns exec ns1 $RDMA link delete mroce1
check_no_output "mroce1 is gone" 'mroce1' ibv_devices
check "rdma link add mroce1 again" $IP netns exec ns1 $RDMA link add mroce1 type metaroce netdev veth1
check_output "mroce1 is back" 'mroce1' ibv_devices

# Links of different MTU classes: 1500 bytes give 1344-byte payloads, 1400 the IB MTU's 1024
# (docs/wire-format.md, Segmentation). HELLO carries each end's payload MTU: the other end
# counts the mismatch and says it in the kernel log.
hello_mtu_mismatch() { cat /sys/class/infiniband/$1/ports/1/hw_counters/hello_mtu_mismatch; }
check "equal links: no HELLO MTU mismatch" test "$(hello_mtu_mismatch mroce1)" = 0
$IP netns exec ns2 $RDMA link delete mroce2
$IP -n ns2 link set veth2 mtu 1400
$IP netns exec ns2 $RDMA link add mroce2 type metaroce netdev veth2
# Connecting a QP pair sends HELLO (the transfer itself may fail).
$IP netns exec ns2 timeout 10 ibv_rc_pingpong -d mroce2 -g 1 -n 1 >/dev/null 2>&1 &
sleep 1
$IP netns exec ns1 timeout 10 ibv_rc_pingpong -d mroce1 -g 1 -n 1 $NS2_ADDR >/dev/null 2>&1
wait
check "link MTUs 1500 and 1400: mroce1 counts the peer's other payload MTU" \
	wait_for 5 sh -c "[ \$(cat /sys/class/infiniband/mroce1/ports/1/hw_counters/hello_mtu_mismatch) -ge 1 ]"
check "link MTUs 1500 and 1400: so does mroce2" test "$(hello_mtu_mismatch mroce2)" -ge 1
check_output "the kernel log names the mismatch" 'sends 1024-byte packets, this device 1344' dmesg_since_mark
$IP -n ns2 link set veth2 mtu 1500

# Netdev unregistration removes the device (and does not hang on the netdev's refcount).
check "ip link del veth1 (takes veth2 with it)" timeout 30 $IP -n ns1 link del veth1
wait_for 10 sh -c "! ibv_devices | grep -q mroce"
check_no_output "both devices gone with their netdevs" 'mroce[12]' ibv_devices

# rxe and metaroce side by side: different UDP ports, both usable.
teardown_pair
check "modprobe rdma_rxe" modprobe rdma_rxe
$IP netns add ns3
$IP link add veth3 netns ns3 type veth peer name veth4 netns ns3
$IP -n ns3 link set veth3 up
$IP -n ns3 link set veth4 up
$IP netns exec ns3 $RDMA link add rxe3 type rxe netdev veth3
$IP netns exec ns3 $RDMA link add mroce4 type metaroce netdev veth4
check_output "rxe and metaroce devices coexist" 'mroce4' ibv_devices
check_output "rxe still lists" 'rxe3' ibv_devices

# Unload with a device present: the driver unregisters it cleanly.
check "rmmod metaroce with a device present" rmmod metaroce
check_no_output "no metaroce device after unload" 'mroce' ibv_devices
check "modprobe metaroce again" modprobe metaroce
$IP netns exec ns3 $RDMA link add mroce4 type metaroce netdev veth4
check_output "device created after reload" 'mroce4' ibv_devices
$IP netns del ns3
wait_for 10 sh -c "! ibv_devices | grep -q mroce4"
check "rmmod metaroce" rmmod metaroce
check "rmmod rdma_rxe" rmmod rdma_rxe
check_no_output "kernel log clean (no oops, WARN, leak)" "$KERNEL_TROUBLE" dmesg_since_mark
suite_end
