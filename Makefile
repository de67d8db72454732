# SPDX-License-Identifier: GPL-2.0
#
# metaroce: the two commands a newcomer needs are
#   make demo    set everything up (host packages, kernel, guest image, module, provider) and
#                show mroce0 between two network namespaces in a QEMU guest
#   make check   host tests, lint, module build, then the selftests inside the guest
# Everything expensive is cached in ~/.cache/metaroce (override with METAROCE_CACHE).

SHELL := /bin/bash
REPO := $(abspath .)
BUILD := $(REPO)/build
GUEST := $(BUILD)/guest
LLVM_BIN := /usr/lib/llvm-22/bin
export PATH := $(LLVM_BIN):$(HOME)/.cargo/bin:$(PATH)

# The test kernel's build directory (built and cached on first use).
KDIR_FILE := $(BUILD)/kdir
KERNEL_PROFILE ?= fast
export KERNEL_PROFILE

.PHONY: all setup kernel module provider image payload vm cluster demo-cluster shell demo check check-host check-debug \
	bench bench-quick sim sim-quick clean

all: payload

setup:
	qemu-ci/setup-host.sh

kernel: setup
	@mkdir -p $(BUILD)
	qemu-ci/build-kernel.sh > $(KDIR_FILE).tmp
	@test -f "$$(cat $(KDIR_FILE).tmp)/.done" || { echo "build-kernel.sh printed no kernel directory: $$(head -c 200 $(KDIR_FILE).tmp)" >&2; exit 1; }
	mv $(KDIR_FILE).tmp $(KDIR_FILE)
	@echo "KDIR=$$(cat $(KDIR_FILE))"

# The module must build without a single warning (Rust and C); clippy runs on the Rust side.
module: kernel
	@set -o pipefail; kdir=$$(cat $(KDIR_FILE)); \
	$(MAKE) -C $$kdir M=$(REPO) LLVM=1 CLIPPY=1 modules 2>&1 | tee $(BUILD)/module-build.log
	@if grep -Ei '(^|[^_])warning' $(BUILD)/module-build.log; then \
		echo "module build: warnings are errors" >&2; exit 1; fi

provider: setup
	rdma-core-provider/build.sh

image: setup
	qemu-ci/build-image.sh

# What the guest installs at boot (see qemu-ci/guest-init.sh). rootfs/ is unpacked onto /: the
# provider as `make -C rdma-core-provider install` lays it out (libmetaroce.so.1, the plugin
# symlink libibverbs/libmetaroce-rdmav34.so -> ../libmetaroce.so.1, metaroce_dv.h,
# metaroce.driver), the direct verbs' test programs built on the host, the plane CLI, and
# rdma-core's own tests/ (for selftests/tests/rdma-core.sh). The copy to the guest's share
# dereferences symlinks, so rootfs.symlinks lists them for guest-init.sh.
payload: module provider
	@rm -rf $(GUEST) && mkdir -p $(GUEST)
	cp metaroce.ko $(GUEST)/
	$(MAKE) --no-print-directory -C rdma-core-provider install DESTDIR=$(GUEST)/rootfs
	bins=$$(selftests/dv/build.sh) && for bin in $$bins; do \
		install -D -m 755 "$$bin" $(GUEST)/rootfs/usr/local/bin/$$(basename "$$bin") || exit 1; done
	cp -r selftests $(GUEST)/selftests
	tree=$$(rdma-core-provider/prepare-rdma-core.sh) && mkdir -p $(GUEST)/rootfs/opt/metaroce/rdma-core-tests && \
		cp -r "$$tree/tests" $(GUEST)/rootfs/opt/metaroce/rdma-core-tests/tests
	install -D -m 755 tools/metaroce-plane $(GUEST)/rootfs/usr/local/sbin/metaroce-plane
	cd $(GUEST)/rootfs && find . -type l -printf '%P %l\n' | sort >$(GUEST)/rootfs.symlinks

# make vm CMD='ibv_devices': run a command as root in a fresh guest (killed after VM_TIMEOUT
# seconds); make shell: interactive.
VM_TIMEOUT ?= 1800
vm: payload image
	KDIR=$$(cat $(KDIR_FILE)) qemu-ci/run-vm.sh --timeout $(VM_TIMEOUT) --payload $(GUEST) -- "$(CMD)"

# make cluster CMD='...': GUESTS guests (default 3) on a fabric of PLANES planes (default 2),
# each with its own kernel and a metaroce device over the planes; CMD runs on g1 while the
# others serve (ALL=1: on every guest). See qemu-ci/run-cluster.sh and selftests/cluster/.
GUESTS ?= 3
PLANES ?= 2
cluster: payload image
	KDIR=$$(cat $(KDIR_FILE)) qemu-ci/run-cluster.sh --guests $(GUESTS) --planes $(PLANES) \
		$(if $(filter 1,$(ALL)),--all) --timeout $(VM_TIMEOUT) --payload $(GUEST) --out $(BUILD)/cluster -- "$(CMD)"

# make demo-cluster: the showcase on 3 guests and 2 planes (selftests/cluster/demo.sh): MPI
# Allreduce and Alltoall over metaroce, rxe and TCP as a table, and a plane cut in the middle
# of a long Allreduce; the table in build/cluster-demo/g1/demo.md.
demo-cluster: payload image
	KDIR=$$(cat $(KDIR_FILE)) qemu-ci/run-cluster.sh --guests $(GUESTS) --planes $(PLANES) \
		--timeout $(VM_TIMEOUT) --payload $(GUEST) --out $(BUILD)/cluster-demo -- \
		"bash /opt/metaroce/selftests/cluster/demo.sh"

shell: payload image
	KDIR=$$(cat $(KDIR_FILE)) qemu-ci/run-vm.sh --payload $(GUEST) --interactive

demo: payload image
	KDIR=$$(cat $(KDIR_FILE)) qemu-ci/run-vm.sh --payload $(GUEST) -- /opt/metaroce/selftests/demo.sh

check-host:
	selftests/check.sh host

check:
	selftests/check.sh all

# make check-debug: the guest suites that check behaviour (not speed) on the debug kernel
# (lockdep, KASAN, kmemleak, DEBUG_LIST); fails on any checker's report or a boot whose
# checkers were off (selftests/check.sh debug; DEBUG_SUITES to choose).
check-debug:
	KERNEL_PROFILE=debug selftests/check.sh debug

# make bench: metaroce, rxe and kernel TCP side by side in one guest boot (selftests/bench/);
# report in build/bench/report.md. PROFILE=quick (or make bench-quick) takes a few minutes.
PROFILE ?= full
bench: payload image
	selftests/bench/bench.sh $(PROFILE)

bench-quick: payload image
	selftests/bench/bench.sh quick

# make sim: the fabric simulator's scenario table (sim/, metaroce-sim): MetaRoCE against
# RoCEv2- and IRN-like baselines on a 64-host leaf-spine fabric (collectives, random loss,
# 1/4/8 planes, a failure mid-collective, 4,032 QPs, the simulator's speed), then its core
# (All-Reduce, pairwise All-to-All, 1% loss, 4 planes, bulk transfers through loss, planes,
# 4 QPs per pair and a spine failure) at each of SIM_NODES hosts (comma-
# separated; empty: none; SIM_NODES=256,1024 adds 1,024 hosts); report in
# build/sim/report.md and results.csv. make sim-quick: a 16-host table in seconds that asserts
# that every collective completes with every byte delivered and that the same seed gives the
# same results (one of make check's host steps).
SIM_NODES ?= 256

sim:
	cargo run --release --locked -p metaroce-sim -- table --out $(BUILD)/sim --nodes "$(SIM_NODES)"

sim-quick:
	cargo run --release --locked -p metaroce-sim -- table --quick --out $(BUILD)/sim-quick

clean:
	-kdir=$$(cat $(KDIR_FILE) 2>/dev/null) && [ -n "$$kdir" ] && $(MAKE) -C $$kdir M=$(REPO) clean
	rm -rf $(BUILD) target
