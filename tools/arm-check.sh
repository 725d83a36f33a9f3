#!/usr/bin/env bash
# The aarch64 build's checks, run here under qemu-aarch64 (user-mode emulation) after
# `bash tools/arm-build.sh`, at each QEMU CPU model of tools/arm-env.sh (ARM_QEMU_CPUS):
# cortex-a57 (ARMv8.0, plain NEON), neoverse-n1 (+ dotprod, fp16) and max (+ i8mm, bf16, SVE, ...).
# An instruction a model lacks ends the program with SIGILL, so each run-time choice of the
# kernels' instruction set runs on a CPU that has exactly what it may use.
#
#   1. cpu models: a probe compiled for aarch64 prints the HWCAP bits each model gives a program
#      (what is_aarch64_feature_detected! reads); each must be what its name promises, or the
#      runs below would not test what they say.
#   2. kernels: spark-backend's unit tests and integration tests for aarch64 (cargo test
#      --no-run, then each test program through qemu, as cargo's runner would). Every program
#      runs under ONCE_CPU (cortex-a57, the model with the fewest features: an instruction the
#      build must not use is a SIGILL there); under the other models every program but the three
#      that compare whole kernel families with the generic table, ~1-2 min each under qemu
#      (ONCE_TESTS below). Those would run the same code again: Spark has one AArch64 table
#      (NEON; the unit test arch::tests::one_aarch64_table fails if a second appears, whose
#      models would then need them) and ggml is built for plain ARMv8.0 (tools/arm-build.sh
#      checks GGML_CPU_ARM_ARCH), so no model changes which instructions they run. The test
#      build uses the llama.cpp build of tools/arm-build.sh (checked below: one build per
#      target).
#   3. end to end: pytest tests/python/arm/test_arm.py (the shipped model through the aarch64
#      spark-convert, spark run, spark eval and llama-completion with the plugin, against the
#      x86 build in target/debug; tests/run.sh runs it as part of the whole pytest run).
#
# qemu runs floating point ~37x slower than the host: nothing measured here is ARM speed.
#
# Usage: bash tools/arm-check.sh [--cpus | --kernels | --e2e]... [--quiet]
#   (no part named)  all three
#   --quiet          only failures, and one line per part
# Exit 0: passed; 1: a check failed (each failure is named at the end); 2: bad usage.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD

# Integration tests run under ONCE_CPU only (test target names of spark-backend/tests/):
# ffn_rows compares every table the CPU has with the generic one, bit for bit, for every weight
# type; ffn_kernels and ffn_fused compare whole ops with float64 for every weight type, shape
# and thread count. ~1-2 min each under qemu on 2 cores. The other programs, the unit tests
# among them (kernel choice, SPARK_ISA), run under every model.
ONCE_TESTS=(ffn_rows ffn_kernels ffn_fused)
ONCE_CPU=cortex-a57

parts=()
quiet=0
for arg in "$@"; do
    case "$arg" in
        --cpus) parts+=(cpus) ;;
        --kernels) parts+=(kernels) ;;
        --e2e) parts+=(e2e) ;;
        --quiet) quiet=1 ;;
        -h|--help) sed -n '2,31p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
        *) echo "arm-check: unknown argument '$arg' (see --help)" >&2; exit 2 ;;
    esac
done
[ ${#parts[@]} -gt 0 ] || parts=(cpus kernels e2e)
say() { if [ "$quiet" = 0 ]; then echo "arm-check: $*"; fi; }
die() { echo "arm-check: error: $*" >&2; exit 1; }

# shellcheck source=tools/arm-env.sh
source tools/arm-env.sh
arm_require
[ -f "$ARM_OUT/llama-out-dir" ] && [ -x "$ARM_OUT/bin/spark" ] \
    || die "no aarch64 build in $ARM_OUT: run bash tools/arm-build.sh first"
python=$root/.venv/bin/python
[ -x "$python" ] || die "$python missing: run bash tools/setup.sh"
log=$ARM_OUT/log
mkdir -p "$log"

failures=()
timings=()
fail() { failures+=("$1"); echo "arm-check: FAILED: $1" >&2; }
part_done() { # part_done NAME START_SECONDS
    local s=$((SECONDS - $2))
    timings+=("$1 ${s}s")
    if [ "$quiet" = 1 ]; then echo "arm-check: $1: done in ${s}s"; else say "$1: ${s}s"; fi
}

# 1. What each CPU model gives a program.
check_cpus() {
    local t0=$SECONDS probe=$ARM_OUT/probe cpu got want
    declare -A expect=(
        [cortex-a57]="asimd=1 asimddp=0 i8mm=0"
        [neoverse-n1]="asimd=1 asimddp=1 i8mm=0"
        [max]="asimd=1 asimddp=1 i8mm=1"
    )
    mkdir -p "$probe"
    cat >"$probe/hwcaps.c" <<'EOF'
/* The Linux HWCAP bits an aarch64 program sees (what std::arch::is_aarch64_feature_detected!
   reads): tools/arm-check.sh, part 1. */
#include <stdio.h>
#include <sys/auxv.h>
#include <asm/hwcap.h>
int main(void) {
    unsigned long h = getauxval(AT_HWCAP), h2 = getauxval(AT_HWCAP2);
    printf("asimd=%d asimddp=%d i8mm=%d\n", !!(h & HWCAP_ASIMD), !!(h & HWCAP_ASIMDDP),
           !!(h2 & HWCAP2_I8MM));
    return 0;
}
EOF
    aarch64-linux-gnu-gcc -O1 -o "$probe/hwcaps" "$probe/hwcaps.c" || die "cannot compile $probe/hwcaps.c"
    for cpu in "${ARM_QEMU_CPUS[@]}"; do
        want=${expect[$cpu]:-}
        [ -n "$want" ] || die "no expected HWCAPs for QEMU_CPU=$cpu in $0 (check_cpus)"
        got=$(QEMU_CPU=$cpu qemu-aarch64 "$probe/hwcaps" 2>&1) || got="failed: $got"
        if [ "$got" = "$want" ]; then
            say "QEMU_CPU=$cpu: $got"
        else
            fail "QEMU_CPU=$cpu gives '$got', want '$want' (qemu $(qemu-aarch64 --version | head -n 1))"
        fi
    done
    part_done "cpu models" "$t0"
}

# 2. spark-backend's tests for aarch64 under each model.
check_kernels() {
    local t0=$SECONDS messages=$log/test-messages.json stderr_log=$log/test-build.txt
    local names=() test_args=() name exe cpu t1 out_log line
    # spark-backend's integration test targets, by name (cargo metadata)
    mapfile -t names < <("$ARM_CARGO" metadata --no-deps --format-version 1 --offline | "$python" -c '
import json, sys
m = json.load(sys.stdin)
p = next(p for p in m["packages"] if p["name"] == "spark-backend")
print("\n".join(t["name"] for t in p["targets"] if "test" in t["kind"]))')
    [ ${#names[@]} -gt 0 ] || die "cargo metadata lists no integration tests of spark-backend"
    printf '%s\n' "${ARM_QEMU_CPUS[@]}" | grep -qx "$ONCE_CPU" \
        || die "ONCE_CPU=$ONCE_CPU is not among ARM_QEMU_CPUS (tools/arm-env.sh): update $0"
    for name in "${ONCE_TESTS[@]}"; do
        printf '%s\n' "${names[@]}" | grep -qx "$name" \
            || die "ONCE_TESTS names '$name', which is not a test of spark-backend: update $0"
    done
    for name in "${names[@]}"; do test_args+=(--test "$name"); done
    say "building spark-backend's tests for $ARM_TARGET"
    if ! arm_cargo test -p spark-backend --lib "${test_args[@]}" --no-run \
            --message-format=json-render-diagnostics >"$messages" 2>"$stderr_log"; then
        grep -v '^ *\(Compiling\|Blocking\)' "$stderr_log" | tail -n 60 >&2
        die "cargo test --no-run for $ARM_TARGET failed (log: $stderr_log)"
    fi
    # one llama.cpp build per target: the tests' must be tools/arm-build.sh's
    local tests_llama built_llama
    tests_llama=$("$python" -c '
import json, sys
for line in open(sys.argv[1]):
    m = json.loads(line)
    if m.get("reason") == "build-script-executed" and "patches/llama-cpp-sys-2" in m.get("package_id", ""):
        print(m["out_dir"])' "$messages")
    built_llama=$(cat "$ARM_OUT/llama-out-dir")
    [ "$tests_llama" = "$built_llama" ] || die "the test build uses the llama.cpp build in \
'$tests_llama', tools/arm-build.sh installed '$built_llama': cargo resolved other features or \
flags for llama-cpp-sys-2 (a second llama.cpp build). Keep this script's cargo selection and \
tools/arm-env.sh's flags in step with tools/arm-build.sh"
    # the test programs of spark-backend: "name path" (the unit tests are named spark_backend)
    local programs=()
    mapfile -t programs < <("$python" -c '
import json, sys
for line in open(sys.argv[1]):
    m = json.loads(line)
    if m.get("reason") == "compiler-artifact" and m.get("executable") and m["profile"]["test"] \
            and "/spark-backend#" in m["package_id"]:
        print(m["target"]["name"], m["executable"])' "$messages" | sort)
    [ ${#programs[@]} -eq $((${#names[@]} + 1)) ] || die "cargo built ${#programs[@]} test \
programs of spark-backend, expected ${#names[@]} integration tests + the unit tests (see $messages)"
    part_done "kernel tests build" "$t0"

    local counts=()
    for cpu in "${ARM_QEMU_CPUS[@]}"; do
        t1=$SECONDS
        local passed=0 ran=0 skipped=()
        for line in "${programs[@]}"; do
            name=${line%% *}
            exe=${line#* }
            if [[ " ${ONCE_TESTS[*]} " == *" $name "* ]] && [ "$cpu" != "$ONCE_CPU" ]; then
                skipped+=("$name")
                continue
            fi
            out_log=$log/test-$cpu-$name.txt
            local s0=$SECONDS rc=0
            # as cargo test runs them: from the package's directory, through the runner
            (cd spark-backend && QEMU_CPU=$cpu qemu-aarch64 "$exe" -q) >"$out_log" 2>&1 || rc=$?
            local result
            result=$(grep '^test result:' "$out_log" | tail -n 1 || true)
            local n
            n=$(sed -n 's/^test result: [a-zA-Z]*\. \([0-9]*\) passed.*/\1/p' <<<"$result")
            if [ "$rc" -ne 0 ] || [ -z "$n" ]; then
                tail -n 40 "$out_log" >&2
                local sig=""
                [ "$rc" -eq 132 ] && sig=" (SIGILL: an instruction QEMU_CPU=$cpu lacks)"
                fail "QEMU_CPU=$cpu $name: exit $rc$sig (log: $out_log)"
                continue
            fi
            passed=$((passed + n))
            ran=$((ran + 1))
            say "QEMU_CPU=$cpu $name: $n passed in $((SECONDS - s0))s"
        done
        counts+=("QEMU_CPU=$cpu: $passed tests in $ran programs${skipped:+ (not run here: ${skipped[*]}, run under $ONCE_CPU)}")
        part_done "kernel tests QEMU_CPU=$cpu" "$t1"
    done
    for line in "${counts[@]}"; do echo "arm-check: $line"; done
}

# 3. End to end.
check_e2e() {
    local t0=$SECONDS
    local pytest_args=(-q tests/python/arm)
    [ "$quiet" = 1 ] || pytest_args+=(-rs)
    if ! "$python" -m pytest "${pytest_args[@]}"; then
        fail "end to end: pytest tests/python/arm"
    fi
    part_done "end to end" "$t0"
}

for part in "${parts[@]}"; do
    case "$part" in
        cpus) check_cpus ;;
        kernels) check_kernels ;;
        e2e) check_e2e ;;
    esac
done
say "times: ${timings[*]/%/;}"
if [ ${#failures[@]} -gt 0 ]; then
    echo "arm-check: ${#failures[@]} failed:" >&2
    printf '  %s\n' "${failures[@]}" >&2
    exit 1
fi
echo "arm-check: passed (${parts[*]})"
