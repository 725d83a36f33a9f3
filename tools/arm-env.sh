# Sourced by tools/arm-build.sh and tools/arm-check.sh (run from the repository root): the one
# environment of the aarch64 cross build, so that the build, the tests and any cargo command
# run by hand with it share one cargo target directory and one llama.cpp build.
#
#   arm_require         exits with a hint naming what is missing of what tools/setup.sh installs
#   arm_cargo CMD ARGS...   Debian's cargo (/usr/bin/cargo) CMD --target aarch64-unknown-linux-gnu ARGS
#
# By hand, from the repository root, in a subshell (the variables would otherwise stay in your
# shell and send your next plain `cargo` to Debian's rustc and target/aarch64/cargo):
#   (source tools/arm-env.sh && QEMU_CPU=cortex-a57 arm_cargo test -p spark-backend -p spark-cli --lib)
# (-p spark-cli: see tools/arm-check.sh, part 2, for why the tests select it too.) Clippy on the
# aarch64-only code (not in CI: Debian's clippy moves with its security updates), after
# `apt-get install rust-web-clippy`, with /usr/bin first so cargo finds Debian's cargo-clippy:
#   (source tools/arm-env.sh && PATH=/usr/bin:$PATH arm_cargo clippy -p spark-backend -p spark-cli --all-targets -- -D warnings)
#
# Why each variable:
#   RUSTC, RUSTDOC   Debian's Rust (rustc-web, 1.96 in bookworm-security) has an aarch64 standard
#                    library (libstd-rust-web-dev:arm64); rustup's toolchain in ~/.cargo/bin,
#                    first in PATH, has none ("can't find crate for std"), and rustup's servers
#                    are not reachable from here. Debian's rustc differs from rustup's, so the
#                    build has its own target directory: target/aarch64/cargo.
#   *_LINKER, CC_/CXX_/AR_  the GNU cross toolchain (gcc-aarch64-linux-gnu, g++-...); the cc and
#                    cmake crates use them for the llama.cpp build (cmake-rs sets
#                    CMAKE_SYSTEM_NAME=Linux, CMAKE_SYSTEM_PROCESSOR=aarch64 when target != host).
#   *_RUNNER         cargo test/run start aarch64 programs through qemu-aarch64 (user-mode
#                    emulation; binfmt_misc is not mounted in this VM, so never exec them bare).
#   *_RUSTFLAGS      replaces .cargo/config.toml's `-C target-cpu=native` (the x86 host's CPU;
#                    it would also make llama-cpp-sys-2 build ggml with GGML_NATIVE) with a run
#                    path $ORIGIN/../lib: the installed target/aarch64/bin/* find
#                    target/aarch64/lib/ without LD_LIBRARY_PATH. With no target-cpu the
#                    crate builds ggml with GGML_NATIVE=OFF, GGML_CPU_ARM_ARCH=armv8-a (plain
#                    NEON, runs on every aarch64 CPU); the Spark kernels pick their instruction
#                    set at run time. The flags are part of the llama-cpp-sys-2 build's hash:
#                    other flags (here or in RUSTFLAGS) mean another ~9 min llama.cpp build.
#   QEMU_LD_PREFIX   unset: the programs' loader /lib/ld-linux-aarch64.so.1 and libraries come
#                    from the arm64 multiarch packages (libc6:arm64, libstdc++6:arm64) at their
#                    normal paths. With a prefix (or -L) of /usr/aarch64-linux-gnu, the cross
#                    toolchain's libc, every program hangs in its first pthread_create.
#   RUSTFLAGS, CARGO_ENCODED_RUSTFLAGS  unset: they would replace the flags above.

ARM_TARGET=aarch64-unknown-linux-gnu
ARM_OUT=$PWD/target/aarch64
ARM_CARGO=/usr/bin/cargo
# The QEMU CPU models the checks run under: plain NEON (ARMv8.0), + dotprod and fp16 (ARMv8.2),
# and qemu's `max` (+ i8mm, bf16, SVE, SVE2, ...). A program that uses an instruction the model
# lacks gets SIGILL.
ARM_QEMU_CPUS=(cortex-a57 neoverse-n1 max)

export CARGO_TARGET_DIR=$ARM_OUT/cargo
export RUSTC=/usr/bin/rustc
export RUSTDOC=/usr/bin/rustdoc
export CARGO_TARGET_AARCH64_UNKNOWN_LINUX_GNU_LINKER=aarch64-linux-gnu-gcc
export CARGO_TARGET_AARCH64_UNKNOWN_LINUX_GNU_RUNNER=qemu-aarch64
export CARGO_TARGET_AARCH64_UNKNOWN_LINUX_GNU_RUSTFLAGS='-C link-arg=-Wl,-rpath,$ORIGIN/../lib'
export CC_aarch64_unknown_linux_gnu=aarch64-linux-gnu-gcc
export CXX_aarch64_unknown_linux_gnu=aarch64-linux-gnu-g++
export AR_aarch64_unknown_linux_gnu=aarch64-linux-gnu-ar
unset QEMU_LD_PREFIX RUSTFLAGS CARGO_ENCODED_RUSTFLAGS

arm_cargo() {
    local cmd=$1
    shift
    "$ARM_CARGO" "$cmd" --target "$ARM_TARGET" "$@"
}

# What tools/setup.sh installs for the cross build, checked the way the build uses it.
arm_require() {
    local me missing=() libdir
    me=$(basename "$0" .sh)
    if [ "$(uname -m)" != x86_64 ]; then
        echo "$me: this host is $(uname -m): the aarch64 cross build and qemu checks are for x86-64 hosts; on an ARM machine build natively (cargo build, tools/upstream.sh: README, \"ARM CPUs\")" >&2
        exit 1
    fi
    [ -x /usr/bin/rustc ] && [ -x /usr/bin/cargo ] || missing+=("Debian's rustc and cargo (rustc-web, cargo-web)")
    if [ -x /usr/bin/rustc ]; then
        libdir=$(/usr/bin/rustc --print target-libdir --target "$ARM_TARGET" 2>/dev/null) || libdir=
        compgen -G "$libdir/libstd-*.rlib" >/dev/null || missing+=("the aarch64 Rust standard library (libstd-rust-web-dev:arm64)")
    fi
    command -v aarch64-linux-gnu-gcc >/dev/null 2>&1 || missing+=(aarch64-linux-gnu-gcc)
    command -v aarch64-linux-gnu-g++ >/dev/null 2>&1 || missing+=(aarch64-linux-gnu-g++)
    command -v qemu-aarch64 >/dev/null 2>&1 || missing+=(qemu-aarch64)
    [ -e /lib/ld-linux-aarch64.so.1 ] || missing+=("the arm64 loader /lib/ld-linux-aarch64.so.1 (libc6:arm64)")
    [ -e /usr/lib/aarch64-linux-gnu/libstdc++.so.6 ] || missing+=("libstdc++6:arm64")
    if [ ${#missing[@]} -gt 0 ]; then
        printf '%s: missing for the aarch64 build: %s\n' "$me" "${missing[*]}" >&2
        echo "$me: run bash tools/setup.sh (it installs them with apt-get)" >&2
        exit 1
    fi
}
