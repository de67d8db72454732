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
banner "demo OK: mroce1 and mroce2 are ACTIVE Ethernet RDMA devices"
