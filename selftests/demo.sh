#!/bin/bash
# SPDX-License-Identifier: GPL-2.0
# make demo: two network namespaces joined by a veth pair, a metaroce device on each end,
# shown by the stock tools.
set -eu
source "$(dirname "$0")/lib.sh"
banner() { printf '\n=== %s\n' "$*"; }

modprobe metaroce
setup_pair metaroce mroce
banner "ip -n ns1 addr / ip -n ns2 addr"
$IP -n ns1 -br addr show veth1
$IP -n ns2 -br addr show veth2
banner "rdma link show"
$RDMA link show
banner "rdma dev show"
$RDMA dev show
banner "ibv_devices"
ibv_devices
banner "ibv_devinfo -v -d mroce1"
ibv_devinfo -v -d mroce1
banner "ibv_devinfo -d mroce2"
ibv_devinfo -d mroce2
wait_for 5 sh -c "ibv_devinfo -d mroce1 | grep -q PORT_ACTIVE"
ibv_devinfo -d mroce1 | grep -q PORT_ACTIVE
ibv_devinfo -d mroce1 | grep -q 'link_layer:.*Ethernet'
banner "ib_write_bw, 64 KiB messages, mroce1 (ns1) -> mroce2 (ns2), over MetaRoCE"
$IP netns exec ns2 ib_write_bw -d mroce2 -x 1 -s 65536 -n 500 --report_gbits >/dev/null 2>&1 &
sleep 1
$IP netns exec ns1 ib_write_bw -d mroce1 -x 1 -s 65536 -n 500 --report_gbits $NS2_ADDR
wait
banner "rdma statistic show link mroce1/1"
$RDMA statistic show link mroce1/1
banner "demo OK: mroce1 and mroce2 are ACTIVE Ethernet RDMA devices moving data over MetaRoCE"
