# SPDX-License-Identifier: Apache-2.0
# vgpu build: gcc alone, no CUDA toolkit.
#   make          build/libvgpu.so, build/simgpu/libcuda.so.1, build/simgpu/libnvidia-ml.so.1, C test programs
#   make demo     install what is needed and run the demo (simgpu when there is no GPU)
#   make test     install what is needed and run the whole test suite
#   make bench    run the benchmarks
#   make image    the node image vgpu:<version> (Containerfile) with podman, else docker

CC      ?= gcc
CFLAGS  ?= -O2 -g
CFLAGS  += -std=gnu11 -Wall -Wextra -fPIC -fvisibility=hidden -pthread -D_GNU_SOURCE
LDLIBS  := -ldl -pthread
B       := build

COMMON_SRC := $(wildcard libvgpu/common/*.c)
VGPU_SRC   := $(wildcard libvgpu/src/*.c) $(COMMON_SRC)
SIM_SRC    := libvgpu/simgpu/state.c libvgpu/simgpu/engine.c
CUDA_SRC   := $(wildcard libvgpu/simgpu/cuda_*.c) $(SIM_SRC) $(COMMON_SRC)
NVML_SRC   := $(wildcard libvgpu/simgpu/nvml_*.c) $(SIM_SRC) $(COMMON_SRC)
HEADERS    := $(wildcard libvgpu/include/*.h libvgpu/common/*.h libvgpu/src/*.h libvgpu/simgpu/*.h) Makefile
TEST_SRC   := $(wildcard libvgpu/tests/*.c)
TEST_BIN   := $(patsubst libvgpu/tests/%.c,$(B)/tests/%,$(TEST_SRC))

LIBS := $(B)/libvgpu.so $(B)/libvgpu-fileops.so $(B)/simgpu/libcuda.so.1 $(B)/simgpu/libnvidia-ml.so.1

.PHONY: all clean demo test bench deps lint proto proto image check-glibc
all: $(LIBS) $(B)/simgpu/libcuda.so $(B)/simgpu/libnvidia-ml.so $(TEST_BIN)

# libvgpu.so runs inside workload images with an older glibc than the build's: its glibc
# symbols are bound to old versions (libvgpu/common/vg_glibc.h), found before glibc 2.34 in
# libdl.so.2 and libpthread.so.0, which it therefore names (see GLIBC_BASELINE below).
VGPU_GLIBC := -include libvgpu/common/vg_glibc.h
VGPU_LDLIBS := -Wl,--no-as-needed -l:libdl.so.2 -l:libpthread.so.0 -Wl,--as-needed $(LDLIBS)

$(B)/libvgpu.so: $(VGPU_SRC) $(HEADERS)
	@mkdir -p $(@D)
	$(CC) $(CFLAGS) $(VGPU_GLIBC) -shared -Wl,-soname,libvgpu.so -o $@ $(VGPU_SRC) $(VGPU_LDLIBS)

# vgpud's own: a slice's files made and removed in one call, without the GIL
# (arbiter/files/fileops.py). It runs on the node, so its glibc symbols are bound as
# libvgpu.so's are.
$(B)/libvgpu-fileops.so: arbiter/files/native/fileops.c arbiter/files/native/fileops.h libvgpu/common/vg_glibc.h Makefile
	@mkdir -p $(@D)
	$(CC) $(CFLAGS) $(VGPU_GLIBC) -shared -Wl,-soname,libvgpu-fileops.so -o $@ $< $(LDLIBS)

$(B)/simgpu/libcuda.so.1: $(CUDA_SRC) $(HEADERS)
	@mkdir -p $(@D)
	$(CC) $(CFLAGS) -shared -Wl,-soname,libcuda.so.1 -Wl,-Bsymbolic-functions -o $@ $(CUDA_SRC) $(LDLIBS)

$(B)/simgpu/libnvidia-ml.so.1: $(NVML_SRC) $(HEADERS)
	@mkdir -p $(@D)
	$(CC) $(CFLAGS) -shared -Wl,-soname,libnvidia-ml.so.1 -Wl,-Bsymbolic-functions -o $@ $(NVML_SRC) $(LDLIBS)

# -Bsymbolic-functions: like the real driver, simgpu calls and hands out its
# own functions even when a preloaded library defines the same names.
# Unversioned names for clients that dlopen("libcuda.so") / link with -lcuda.
$(B)/simgpu/%.so: $(B)/simgpu/%.so.1
	ln -sf $(<F) $@

# The libvgpu bypass test program must not link the driver: it dlmopen()s it
# into a namespace of its own, where a preloaded libvgpu cannot see its calls.
$(B)/tests/dlmopen_load: libvgpu/tests/dlmopen_load.c $(HEADERS)
	@mkdir -p $(@D)
	$(CC) $(CFLAGS) -Ilibvgpu/include -o $@ $< $(LDLIBS)

# The ledger's trace driver links the pure ledger alone (no driver, no clock).
$(B)/tests/ledger_trace: libvgpu/tests/ledger_trace.c libvgpu/src/ledger.c libvgpu/src/ledger.h
	@mkdir -p $(@D)
	$(CC) $(CFLAGS) -o $@ libvgpu/tests/ledger_trace.c libvgpu/src/ledger.c

# The holder's empty-queue rules played on a trace (tests/libvgpu/test_hold_traces.py).
$(B)/tests/hold_trace: libvgpu/tests/hold_trace.c libvgpu/src/hold.c libvgpu/src/hold.h
	@mkdir -p $(@D)
	$(CC) $(CFLAGS) -o $@ libvgpu/tests/hold_trace.c libvgpu/src/hold.c

# The broker's rules played on a trace (tests/libvgpu/test_policy_traces.py): the pure
# policy alone, no driver and no broker around it.
$(B)/tests/policy_trace: libvgpu/tests/policy_trace.c libvgpu/src/policy.c $(HEADERS)
	@mkdir -p $(@D)
	$(CC) $(CFLAGS) -Ilibvgpu/include -o $@ $< libvgpu/src/policy.c $(LDLIBS)

# A broker's record (VGPU_BROKER_RECORD) played through the same pure policy again.
$(B)/tests/policy_replay: libvgpu/tests/policy_replay.c libvgpu/src/policy.c $(HEADERS)
	@mkdir -p $(@D)
	$(CC) $(CFLAGS) -Ilibvgpu/include -o $@ $< libvgpu/src/policy.c $(LDLIBS)

# C test programs link the simulated driver directly (the "direct symbol" path);
# at run time LD_LIBRARY_PATH picks simgpu or a real driver.
$(B)/tests/%: libvgpu/tests/%.c $(HEADERS) $(B)/simgpu/libcuda.so.1 $(B)/simgpu/libnvidia-ml.so.1
	@mkdir -p $(@D)
	$(CC) $(CFLAGS) -fvisibility=default -Ilibvgpu/include -o $@ $< -L$(B)/simgpu -l:libcuda.so.1 -l:libnvidia-ml.so.1 $(LDLIBS)

# The real-GPU measurement (tests/gpu/gpucheck.sh): dlopen()s libcuda.so.1 itself, links no
# driver, so the one binary runs on a GPU machine without gcc (copy it with the tree).
.PHONY: gpucheck
gpucheck: $(B)/tests/gpucheck
$(B)/tests/gpucheck: tests/gpu/gpucheck.c
	@mkdir -p $(@D)
	$(CC) -O2 -g -std=gnu11 -Wall -Wextra -o $@ $< -ldl -lm

# Everything tests/gpu/gpucheck-all.sh needs on a GPU machine, in the tree's layout
# (docs/real-gpu.md): tar xzf build/vgpu-gpucheck.tar.gz && vgpu-gpucheck/tests/gpu/gpucheck-all.sh OUT
GPUCHECK_FILES := $(B)/libvgpu.so $(B)/tests/gpucheck configs/vgpu.yaml tests/gpu/gpucheck.c \
	tests/gpu/gpucheck.sh tests/gpu/gpucheck-bin.sh tests/gpu/gpucheck-shares.sh tests/gpu/gpucheck-all.sh
.PHONY: gpucheck-bundle
gpucheck-bundle: $(GPUCHECK_FILES)
	tar -czf $(B)/vgpu-gpucheck.tar.gz --transform 's,^,vgpu-gpucheck/,' $(GPUCHECK_FILES)
	@ls -l $(B)/vgpu-gpucheck.tar.gz

clean:
	rm -rf $(B)

# The gRPC stubs are committed; regenerate after editing the .proto
# (tests/arbiter/test_proto.py, tests/vgpu_k8s/test_deviceplugin_proto.py, test_dra_proto.py fail
# while they are stale).
proto:
	./scripts/py -m grpc_tools.protoc -I. --python_out=. --grpc_python_out=. arbiter/proto/vgpu.proto
	./scripts/py -m grpc_tools.protoc -I. --python_out=. --grpc_python_out=. vgpu_k8s/proto/deviceplugin_v1beta1.proto
	./scripts/py -m grpc_tools.protoc -I. --python_out=. --grpc_python_out=. vgpu_k8s/proto/dra_v1.proto
	./scripts/py -m grpc_tools.protoc -I. --python_out=. --grpc_python_out=. vgpu_k8s/proto/dra_v1beta1.proto
	./scripts/py -m grpc_tools.protoc -I. --python_out=. --grpc_python_out=. vgpu_k8s/proto/pluginregistration_v1.proto

deps:
	./scripts/install-deps.sh

demo: deps all
	./scripts/py scripts/demo.py

# Two phases: the tests that measure nothing in time run TEST_JOBS at a time, one test
# file per worker (a file's fixtures are set up once; the slowest files first, see
# tests/conftest.py); those marked `timing` (shares, hand-overs) then run alone, on an
# otherwise idle machine. Both phases always run. Three workers on 2 CPUs: the untimed tests
# mostly wait on the processes they start (phase 1 in 342 s against 472 s with two).
TEST_JOBS ?= 3
test: deps all
	./scripts/py -m pytest -q -n $(TEST_JOBS) --dist loadfile --no-loadscope-reorder \
		-m "not timing" tests; \
	status=$$?; ./scripts/py -m pytest -q -m timing tests || status=$$?; exit $$status

bench: all
	./scripts/py bench/interception.py
	./scripts/py bench/arbiter.py
	./scripts/py bench/compute.py

# Style and types (pip install ruff mypy types-PyYAML types-jsonschema grpc-stubs).
lint:
	ruff check .
	mypy

# The compiled container-path programs, each beside the package it serves: vgpu-hook
# (oci_hook/native/, with the helpers both sides share: the lifecycle client, the spec walk,
# the defaults) and vgpu-runtime and containerd-shim-vgpu-v2 (shim/native/, which builds on
# oci_hook's), with the shim's private bin dir (build/bin/shim, whose runc is a copy of
# vgpu-runtime). They hold the mechanisms; vgpud decides over its lifecycle socket.
HOOK_DIR      := oci_hook/native
NATIVE_DIR    := shim/native
NATIVE_COMMON := $(HOOK_DIR)/vg_common.c
NATIVE_CLIENT := $(NATIVE_COMMON) $(HOOK_DIR)/vg_msg.c $(HOOK_DIR)/vg_spec.c
NATIVE_HDRS   := $(wildcard $(HOOK_DIR)/*.h) $(wildcard $(NATIVE_DIR)/*.h) Makefile
NATIVE_CFLAGS := -O2 -g -std=gnu11 -Wall -Wextra -D_GNU_SOURCE
NATIVE_INCS   := -I$(HOOK_DIR)
# Static: they run on the node, whatever its glibc (the image's build is Debian 12's); they
# use nothing of glibc that needs it dynamic (no NSS, no dlopen).
NATIVE_LDFLAGS := -static
NATIVE_BIN    := $(B)/bin/vgpu-runtime $(B)/bin/vgpu-hook $(B)/bin/containerd-shim-vgpu-v2 \
                 $(B)/bin/shim/runc $(B)/bin/vgpu-broker

.PHONY: native
all: native
native: $(NATIVE_BIN)

$(B)/bin/vgpu-runtime: $(NATIVE_DIR)/vgpu_runtime.c $(NATIVE_DIR)/vg_runc.c $(NATIVE_DIR)/vg_exec.c $(NATIVE_CLIENT) $(NATIVE_HDRS)
	@mkdir -p $(@D)
	$(CC) $(NATIVE_CFLAGS) $(NATIVE_INCS) $(NATIVE_LDFLAGS) -o $@ $(filter %.c,$^) -lm

$(B)/bin/vgpu-hook: $(HOOK_DIR)/vgpu_hook.c $(HOOK_DIR)/vg_mount.c $(NATIVE_CLIENT) $(NATIVE_HDRS)
	@mkdir -p $(@D)
	$(CC) $(NATIVE_CFLAGS) $(NATIVE_INCS) $(NATIVE_LDFLAGS) -o $@ $(filter %.c,$^) -lm

$(B)/bin/containerd-shim-vgpu-v2: $(NATIVE_DIR)/containerd_shim.c $(NATIVE_DIR)/vg_exec.c $(NATIVE_COMMON) $(NATIVE_HDRS)
	@mkdir -p $(@D)
	$(CC) $(NATIVE_CFLAGS) $(NATIVE_INCS) $(NATIVE_LDFLAGS) -o $@ $(filter %.c,$^) -lm

# A copy, not a link: it survives packaging as it is, and vgpu-runtime skips it (as
# its own file, and as $$VGPU_SHIM_BIN) when it looks for the real runc.
$(B)/bin/shim/runc: $(B)/bin/vgpu-runtime
	@mkdir -p $(@D)
	cp -f $< $@.tmp && mv -f $@.tmp $@

# The token broker vgpud runs (libvgpu/src/broker.c and policy.c are also inside libvgpu.so, for
# standalone slices).
BROKER_SRC := libvgpu/broker/vgpu_broker.c libvgpu/src/broker.c libvgpu/src/broker_record.c libvgpu/src/policy.c
$(B)/bin/vgpu-broker: $(BROKER_SRC) libvgpu/src/broker.h libvgpu/src/broker_record.h libvgpu/src/policy.h libvgpu/include/vgpu_sched.h \
                      libvgpu/include/vgpu_timing.h Makefile
	@mkdir -p $(@D)
	$(CC) $(NATIVE_CFLAGS) $(NATIVE_LDFLAGS) -pthread -o $@ $(BROKER_SRC)

# The oldest glibc the shipped native files run on (docs/kubernetes.md#the-image):
# libvgpu.so is preloaded into workload images and the programs run on the node, so a
# build that needs a newer GLIBC_x.y symbol (another compiler or base image) fails here.
GLIBC_BASELINE := 2.17
check-glibc: $(B)/libvgpu.so $(B)/libvgpu-fileops.so $(NATIVE_BIN)
	python3 scripts/check-glibc.py $(GLIBC_BASELINE) $(B)/libvgpu.so $(B)/libvgpu-fileops.so $(NATIVE_BIN)

# The node image the manifests name (configs/kubernetes/daemonset.yaml). IMAGE_ENGINE is
# the build command (podman, else docker); IMAGE_FLAGS adds build flags, e.g.
# --build-arg BASE=<a Debian 12 image> (docs/kubernetes.md#the-image).
VERSION      := $(shell sed -n 's/^version = "\(.*\)"$$/\1/p' pyproject.toml)
IMAGE        ?= vgpu:$(VERSION)
IMAGE_ENGINE ?= $(shell command -v podman || command -v docker)
IMAGE_FLAGS  ?=
image:
	@test -n "$(IMAGE_ENGINE)" || { echo "make image: neither podman nor docker is on PATH" >&2; exit 1; }
	$(IMAGE_ENGINE) build -f Containerfile -t $(IMAGE) $(IMAGE_FLAGS) .
