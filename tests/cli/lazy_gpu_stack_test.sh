#!/usr/bin/env bash
# The binary starts and runs its commands on a machine without the CUDA stack: libcudart,
# libcublasLt, libnccl, libcupti and the driver (libcuda) are never linked, and are opened
# (dlopen) only by `run --backend cuda` (runtime/src/cuda/cuda_api.h) and `run --profile`
# (profiler/src/cupti_api.cc). Three checks:
#   (a) ldd: the binary needs none of them;
#   (b) LD_DEBUG: `--version`, `simulate`, `analyze` and `schedule` load none of them, while
#       `run --backend cuda` opens the CUDA runtime, cuBLASLt and NCCL (and says why it stops);
#   (c) with every such library file hidden (a private mount namespace binds an empty file
#       over each), those commands still work and `run --backend cuda` exits 2 naming the
#       library it lacks, writing nothing. Skipped, with a message, where the test may not
#       create a mount namespace (unshare -m needs CAP_SYS_ADMIN).
# Also prints the resident set size of `--version` (/usr/bin/time -v, when installed).
#
# Usage: lazy_gpu_stack_test.sh path/to/shardscope   (from the repository root)
set -euo pipefail

shardscope=$(realpath "$1")
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
failures=0
fail() { echo "FAIL: $*"; failures=$((failures + 1)); }
gpu_libs='libcudart\.so|libcublasLt\.so|libcublas\.so|libnccl\.so|libcupti\.so|libcuda\.so'

# ---- (a)
if ldd "$shardscope" | grep -E "$gpu_libs" > "$work/ldd.txt"; then
  fail "(a) the binary links the CUDA stack:"; cat "$work/ldd.txt"
fi

# ---- (b) the commands that need no GPU map no GPU library.
plan=examples/tiny-fsdp2-2gpu.yaml
commands=(
  "--version"
  "simulate $plan -o $work/sim -q"
  "schedule $plan -o $work/schedule.json"
  "analyze tests/golden/tiny-fsdp2-2gpu/trace.json"
)
for args in "${commands[@]}"; do
  # shellcheck disable=SC2086
  if ! LD_DEBUG=libs "$shardscope" $args > "$work/out.txt" 2> "$work/ld.txt"; then
    fail "(b) shardscope $args failed: $(grep -v '^ *[0-9]*:' "$work/ld.txt" | tail -3)"
  fi
  if grep -E "(find|calling init|trying file).*($gpu_libs)" "$work/ld.txt" > "$work/loaded.txt"; then
    fail "(b) shardscope $args loaded a GPU library:"; head -3 "$work/loaded.txt"
  fi
done
# `run --backend cuda` opens them itself (and, without a driver or device, stops with exit 2).
set +e
LD_DEBUG=libs "$shardscope" run "$plan" --backend cuda -o "$work/cuda" > /dev/null 2> "$work/ld_cuda.txt"
rc=$?
set -e
# A build without the CUDA backend opens nothing: (b)'s and (c)'s run checks do not apply.
no_backend=0
if grep -q "this build has no CUDA backend" "$work/ld_cuda.txt"; then
  no_backend=1
  echo "  this build has no CUDA backend: run --backend cuda is not expected to open the libraries"
elif [ "$rc" -ne 0 ]; then
  for lib in libcudart libcublasLt libnccl; do
    grep -q "$lib" "$work/ld_cuda.txt" || fail "(b) run --backend cuda did not try to open $lib (exit $rc)"
  done
fi

# ---- (c) the libraries hidden.
if command -v ldconfig > /dev/null; then
  hidden=$( { ldconfig -p | grep -oE "/[^ ]*($gpu_libs)[^ ]*"; \
              ls /usr/local/cuda*/lib*/lib{cudart,cublasLt,cublas,nccl,cupti}.so* 2> /dev/null; } | \
            xargs -r -n1 realpath 2> /dev/null | sort -u)
else
  hidden=""
fi
cat > "$work/hidden.sh" <<INNER
set -eu
: > "$work/empty"
for f in $(echo $hidden); do mount --bind "$work/empty" "\$f"; done
# Nothing of the CUDA stack can be opened any more.
for lib in libcudart.so.13 libnccl.so.2 libcublasLt.so.13; do
  if python3 -c "import ctypes,sys; ctypes.CDLL(sys.argv[1])" "\$lib" 2> /dev/null; then
    echo "HIDING FAILED: \$lib still opens"; exit 3
  fi
done
"$shardscope" --version > "$work/version.txt"
"$shardscope" simulate $plan -o "$work/sim_hidden" -q > /dev/null
test -s "$work/sim_hidden/report.json"
"$shardscope" analyze tests/golden/tiny-fsdp2-2gpu/trace.json > /dev/null
set +e
"$shardscope" run $plan --backend cuda -o "$work/cuda_hidden" > /dev/null 2> "$work/cuda_hidden.err"
echo "run-cuda-exit \$?" > "$work/cuda_hidden.rc"
INNER
if [ -z "$hidden" ]; then
  echo "  (c) no CUDA library on this machine: nothing to hide (the checks above are the test)"
elif unshare -m --propagation private true 2> /dev/null; then
  if unshare -m --propagation private bash "$work/hidden.sh" > "$work/hidden.out" 2>&1; then
    grep -q "run-cuda-exit 2" "$work/cuda_hidden.rc" ||
      fail "(c) run --backend cuda without the libraries: expected exit 2, got $(cat "$work/cuda_hidden.rc")"
    if [ "$no_backend" -eq 0 ]; then
      grep -Eq "needs libcudart\.so\.[0-9]+ \(the CUDA runtime\), which this machine does not have" \
        "$work/cuda_hidden.err" || fail "(c) no message naming the missing library: $(cat "$work/cuda_hidden.err")"
    fi
    [ ! -e "$work/cuda_hidden" ] || fail "(c) run --backend cuda wrote $work/cuda_hidden"
    echo "  (c) hid $(echo "$hidden" | wc -w) library files; simulate, analyze and --version ran"
  else
    fail "(c) with the CUDA libraries hidden: $(tail -5 "$work/hidden.out")"
  fi
else
  echo "  (c) SKIPPED: unshare -m is not permitted here (needs CAP_SYS_ADMIN); (a) and (b) ran"
fi

if [ -x /usr/bin/time ]; then
  rss=$(/usr/bin/time -v "$shardscope" --version 2>&1 > /dev/null | sed -n 's/.*Maximum resident set size (kbytes): //p')
  echo "  --version: maximum resident set size ${rss} KiB"
fi

if [ "$failures" -ne 0 ]; then
  echo "lazy_gpu_stack_test: $failures failure(s)"
  exit 1
fi
echo "lazy_gpu_stack_test: ok"
