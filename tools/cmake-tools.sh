# Sourced by tools/upstream.sh and tools/arm-build.sh: builds llama.cpp tool targets in the
# cmake directory of the cargo build (the libraries there are up to date, so only the tools
# compile), then switches the tools off again, because llama-cpp-sys-2's build script runs
# `cmake --build --target install`, which would otherwise build every tool on the next cargo
# build. Needs `die` from the sourcing script.
#
#   build_tool_targets SRC BUILD LOG_DIR QUIET TARGET...
#     SRC: llama.cpp's source tree (with upstream's tools/ added); BUILD: the cmake build
#     directory; LOG_DIR: where the configure (and, QUIET=1, the build) log goes.

# shellcheck shell=bash
build_tool_targets() {
    local src=$1 build=$2 log_dir=$3 quiet=$4
    shift 4
    local targets=("$@")
    tools_switch() {
        cmake -S "$src" -B "$build" -DLLAMA_BUILD_TOOLS="$1" -DLLAMA_BUILD_SERVER="$1" \
            -DLLAMA_BUILD_EXAMPLES="$1" \
            -DLLAMA_USE_PREBUILT_UI=OFF -DLLAMA_TOOLS_INSTALL=OFF >"$log_dir/cmake-configure.log" 2>&1 \
            || { cat "$log_dir/cmake-configure.log" >&2; die "cmake configure (tools $1) failed"; }
    }
    tools_switch ON
    if [ "$quiet" = 1 ]; then
        cmake --build "$build" -j "$(nproc)" --target "${targets[@]}" >"$log_dir/cmake-build.log" 2>&1 \
            || { tail -n 60 "$log_dir/cmake-build.log" >&2; die "building ${targets[*]} failed (log: $log_dir/cmake-build.log)"; }
    else
        cmake --build "$build" -j "$(nproc)" --target "${targets[@]}"
    fi
    tools_switch OFF
}
