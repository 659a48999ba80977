#!/usr/bin/env bash
# The benchmarks on a lent GPU machine (the workplace's `device` tool), in one call
# that fits its time: the whole training step (train_step_bench.py) on the residual
# stack of 200 layers and the ResNet-like and transformer-like trees, then the
# low-bit states (lowbit_bench.py) on a wider MLP, then the state in host memory
# (memory_bench.py --offload: device bytes, step time and the whole step's peak
# device memory, with XLA's latency-hiding scheduler and without it, to see whether
# overlapping the transfers with the update helps). Each part has its own time limit
# and writes its JSON as it goes, so a part cut short still reports what it measured.
#
#   bash benchmarks/device_run.sh                  # writes under $OUT (default /tmp/eqopt-device)
#   PARTS=offload,offload_nolhs bash benchmarks/device_run.sh   # some parts only
#
# The machine has jax, equinox, jaxtyping and optax but not beartype: carry its wheel
# in .whl/ (see benchmarks/README.md).
set -uo pipefail
OUT=${OUT:-/tmp/eqopt-device}
mkdir -p "$OUT"
if [ -d .whl ]; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir \
        --upgrade --target /tmp/site .whl/*.whl || exit 1
    export PYTHONPATH=/tmp/site
fi
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
SCALE=${SCALE:-100}  # percent of each time limit (a smoke run sets it low)
PARTS=${PARTS:-all}  # comma-separated part names (see each `run` below), or all
limit() { echo $(( $1 * SCALE / 100 + 1 )); }
nvidia-smi -L || true
python3 -c "
import jax, equinox, optax, jaxtyping, beartype, eqopt
print('jax', jax.__version__, jax.devices(), 'equinox', equinox.__version__,
      'optax', optax.__version__, 'jaxtyping', jaxtyping.__version__)
" || exit 1
run() {  # name, seconds, command...
    local name=$1 seconds=$2
    shift 2
    [ "$PARTS" = all ] || [[ ",$PARTS," == *",$name,"* ]] || return 0
    echo "== $name (limit ${seconds}s)"
    timeout "$seconds" "$@" >"$OUT/$name.txt" 2>&1
    echo "   exit $?"
    tail -n 8 "$OUT/$name.txt"
}
TS="python3 benchmarks/train_step_bench.py --rounds 2 --step-reps 7 --rep-seconds 0.05"
run ts_res200 "$(limit 170)" $TS --trees res200 --json "$OUT/ts_res200.json"
run ts_transformer "$(limit 110)" $TS --trees transformer --json "$OUT/ts_transformer.json"
run ts_resnet "$(limit 110)" $TS --trees resnet --json "$OUT/ts_resnet.json"
run lowbit "$(limit 80)" python3 benchmarks/lowbit_bench.py --width 4096 --rounds 4 --kernels \
    --json "$OUT/lowbit.json"
# A width whose packed buffer is not a whole number of 256-element blocks: the
# last block is padded, and the packed update and the codes differ in shape.
run lowbit_4000 "$(limit 70)" python3 benchmarks/lowbit_bench.py --width 4000 --rounds 3 --kernels --no-peak \
    --json "$OUT/lowbit_4000.json"
# The state in host memory against the state on the device, on a transformer of
# about 110M parameters (state: 0.9 GB float32 Adam), the whole step on 8 sequences
# of 512 tokens. Then the same with XLA's latency-hiding scheduler off: the
# transfers are no longer moved to overlap the update (the optimiser step only).
OFFLOAD="python3 benchmarks/memory_bench.py --offload --rounds 3 --reps 3 --steps 3 \
    --tree-args=--tf-width=1024 --tree-args=--tf-blocks=8 --batch 8 --context 512"
run offload "$(limit 150)" $OFFLOAD --json "$OUT/offload.json"
run offload_nolhs "$(limit 90)" env \
    XLA_FLAGS="${XLA_FLAGS:-} --xla_gpu_enable_latency_hiding_scheduler=false" \
    $OFFLOAD --no-training-step --json "$OUT/offload_nolhs.json"
# The tables again, from the JSON of each part (also of a part cut short).
python3 - "$OUT" <<'PY'
import json, pathlib, sys
sys.path.insert(0, "benchmarks")
import train_step_bench
for path in sorted(pathlib.Path(sys.argv[1]).glob("ts_*.json")):
    results = json.loads(path.read_text())["results"]
    if results:
        print(train_step_bench.table(results))
PY
