#!/usr/bin/env bash
# The programs beyond the test suites that a GPU session runs, one section each, into one
# log (the GPU machine returns few files). Called by tools/gpu_check.sh --cmd with $BUILD
# (the build folder) and $ROOT (the checkout, where data/ was carried) set; $OUT gets
# goldens.tar when the parity goldens are written.
#   tools/gpu_extras.sh SECTION...   (nccl parallel mpi golden parity parity-full memory compress-accuracy svd
#                                     parallel-bench resnet-ops attention train-step profile-resnet
#                                     profile-vit-ckpt examples
#                                     galore svd-scale svd-vitb16 cuda-graph gelu-mlp two-gpu profile
#                                     double-backward interpolate)
set -uo pipefail
cd "$(dirname "$0")/.."
data=${ROOT:-.}/data/fashion-mnist
rc=0
section() { echo; echo "==== $1"; }
run() { "$@" || { echo "FAILED ($?): $*"; rc=1; }; }
for s in "$@"; do
  section "$s"
  case "$s" in
    nccl) run "$BUILD/tools/frugal-run" --nproc 2 "$BUILD/tests/nccl_check" ;;
    parallel) run "$BUILD/tools/frugal-run" --nproc 2 "$BUILD/tests/parallel_check" ;;
    mpi)  # the same checks started by Open MPI instead of frugal-run (OMPI_COMM_WORLD_* variables)
      for prog in nccl_check parallel_check; do
        run env OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 mpirun --allow-run-as-root -np 2 \
          -x MASTER_PORT=${MPI_MASTER_PORT:-29533} "$BUILD/tests/$prog"
      done ;;
    two-gpu)  # issue 22 on nvidia-h200-x2: the checks by frugal-run and mpirun, ZeRO-2/3 against DDP, two nodes
      run env FRUGAL_REQUIRE_MULTI_GPU=1 "$BUILD/tools/frugal-run" --nproc 2 "$BUILD/tests/nccl_check"
      run env FRUGAL_REQUIRE_MULTI_GPU=1 "$BUILD/tools/frugal-run" --nproc 2 "$BUILD/tests/parallel_check"
      for prog in nccl_check parallel_check; do
        run env FRUGAL_REQUIRE_MULTI_GPU=1 OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 mpirun \
          --allow-run-as-root -np 2 -x MASTER_PORT=${MPI_MASTER_PORT:-29533} "$BUILD/tests/$prog"
      done
      for model in base large; do
        run "$BUILD/tools/frugal-run" --nproc 2 "$BUILD/bench/parallel_bench" --model $model \
          --modes single,ddp,zero1,zero2,zero3 --batch ${PARALLEL_BATCH:-32}
      done
      # Two nodes on this host, each one process that sees one GPU (issue 22's two-node launch).
      pids=()
      for node in 0 1; do
        CUDA_VISIBLE_DEVICES=$node FRUGAL_REQUIRE_MULTI_GPU=1 "$BUILD/tools/frugal-run" --nnodes 2 --node-rank $node \
          --master-addr 127.0.0.1 --master-port ${TWO_NODE_PORT:-29611} --nproc-per-node 1 "$BUILD/tests/nccl_check" &
        pids+=($!)
      done
      for pid in "${pids[@]}"; do wait "$pid" || { echo "FAILED: two-node nccl_check (pid $pid)"; rc=1; }; done ;;
    golden) run python3 tools/parity_models.py --golden && tar -cf "${OUT:-/tmp}/goldens.tar" tests/golden && ls -la tests/golden ;;
    parity) run python3 tools/parity_models.py --build "$BUILD" --device cuda ;;
    parity-full) run python3 tools/parity_models.py --build "$BUILD" --device cuda --full ;;
    memory) run "$BUILD/bench/memory_matrix" --device cuda ;;
    compress-accuracy)  # FP8 saved activations against none: test accuracy / MLM loss (issue 17)
      models=" ${COMPRESS_MODELS:-vit resnet bert} "  # a subset when device time is short
      for flag in "" "--compress-saved fp8"; do
        [[ $models == *" vit "* ]] && echo "-- train_vit ${flag:-(no compression)}"
        [[ $models == *" vit "* ]] && run "$BUILD/examples/train_vit" --device cuda --epochs ${COMPRESS_EPOCHS:-3} --data-dir "$data" $flag 2>&1 \
          | tr '\r' '\n' | grep -iE "accuracy|epoch [0-9]+/" | tail -4
        [[ $models == *" resnet "* ]] && echo "-- train_resnet ${flag:-(no compression)}"
        [[ $models == *" resnet "* ]] && run "$BUILD/examples/train_resnet" --device cuda --epochs ${COMPRESS_EPOCHS:-3} --data-dir "$data" $flag 2>&1 \
          | tr '\r' '\n' | grep -iE "accuracy|epoch [0-9]+/" | tail -4
        [[ $models == *" bert "* ]] && echo "-- bert_mlm ${flag:-(no compression)}"
        [[ $models == *" bert "* ]] && run "$BUILD/examples/bert_mlm" --device cuda --steps ${COMPRESS_BERT_STEPS:-300} $flag 2>&1 | tr '\r' '\n' \
          | grep -iE "loss" | tail -3
      done ;;
    svd)
      run "$BUILD/bench/svd_compress" --device cuda --epochs ${SVD_EPOCHS:-3} --data-dir "$data" >/tmp/svd.log 2>&1
      tr '\r' '\n' </tmp/svd.log | grep -v "ETA" | tail -40 ;;
    svd-scale)  # issue 20: the ~21M-parameter ViT (12 x 384, 4x4 patches) trained, compressed, fine-tuned
      run timeout ${SVD_SCALE_TIMEOUT:-570} "$BUILD/bench/svd_compress" --model vit21m --device cuda --no-linear \
        --epochs ${SVD21M_EPOCHS:-20} --data-dir "$data" >"${OUT:-/tmp}/svd21m.log" 2>&1
      tr '\r' '\n' <"${OUT:-/tmp}/svd21m.log" | grep -vE "ETA|^ *$" | tail -24 ;;
    svd-vitb16)  # ViT-B/16 224px, random weights: memory and speed at budgets (set SVD_B16_BUDGETS to the
                 # svd-scale table's parameter ratios), then dense vs factorized Linear at its shapes
      run timeout ${SVD_SCALE_TIMEOUT:-570} "$BUILD/bench/svd_compress" --model vitb16 --device cuda \
        --budgets ${SVD_B16_BUDGETS:-0.7,0.65,0.6,0.5} >"${OUT:-/tmp}/svdb16.log" 2>&1
      tr '\r' '\n' <"${OUT:-/tmp}/svdb16.log" | grep -vE "ETA|^ *$|^blocks\.|^layer |^total " | tail -40 ;;
    parallel-bench) run "$BUILD/tools/frugal-run" --nproc 2 "$BUILD/bench/parallel_bench" --batch ${PARALLEL_BATCH:-128} ;;
    resnet-ops)
      run python3 tools/bench_resnet_ops.py --frugal "$BUILD/bench/bench_resnet_ops" --quick ;;
    attention) run python3 tools/bench_attention.py --frugal "$BUILD/bench/bench_attention" ;;
    train-step) run timeout ${TRAIN_STEP_TIMEOUT:-280} python3 tools/train_step_torch.py --frugal "$BUILD/bench/train_step" ${TRAIN_STEP_ROWS:+--rows $TRAIN_STEP_ROWS} ${TRAIN_STEP_COMPILE:+--compile} ;;
    profile-resnet) run "$BUILD/bench/train_step" --model resnet50 --batch 128 --amp --profile /tmp/profile_resnet ;;
    profile-vit-ckpt)  # what is live at ViT-B/16 + checkpointing's peak, with its trace in $OUT
      run "$BUILD/bench/train_step" --model vit_b16 --batch 128 --amp --checkpoint --profile /tmp/profile_vit_ckpt \
        --profile-rows 40 && cp /tmp/profile_vit_ckpt/trace.json "${OUT:-/tmp}/vit_ckpt_trace.json" ;;
    examples)  # the models' training examples (issue 5's "training for real"), each under a time cap
      for prog in "train_resnet --device cuda" "train_vit --device cuda"; do
        run timeout ${EXAMPLE_TIMEOUT:-170} "$BUILD/examples/${prog%% *}" ${prog#* } --data-dir "$data" >/tmp/ex.log 2>&1
        tr '\r' '\n' </tmp/ex.log | grep -vE "ETA|^\s*$" | tail -14
      done
      run timeout ${EXAMPLE_TIMEOUT:-170} "$BUILD/examples/bert_mlm" --device cuda --steps ${BERT_STEPS:-1000} >/tmp/ex.log 2>&1
      tr '\r' '\n' </tmp/ex.log | grep -vE "ETA|^\s*$" | tail -12 ;;
    galore)  # issue 20: GaLore against AdamW on BERT-base: train_step's step time, peak and state bytes, then
             # bert_mlm at BERT-base size for GALORE_STEPS steps (MLM loss; GaLore at the same lr and at 4x);
             # GALORE_TRAIN_STEP_ONLY=1 stops after train_step
      # Alone, then with the memory planner's techniques: every block checkpointed, and the
      # planner's choice for half the default peak.
      for o in adamw galore; do
        for extra in "" "--checkpoint" "--memory-budget 0.5x"; do
          echo "-- train_step bert_base b64 --optim $o $extra"
          run "$BUILD/bench/train_step" --model bert_base --batch 64 --amp --optim $o --galore-rank 128 $extra \
            | grep -E "step_ms|peak_allocated|optimizer_state"
        done
      done
      [ -n "${GALORE_TRAIN_STEP_ONLY:-}" ] && continue
      base="--device cuda --layers 12 --hidden 768 --heads 12 --intermediate 3072 --batch 32 --steps ${GALORE_STEPS:-600}"
      for run_args in "--optim adamw --lr 2e-4" "--optim galore --galore-rank 128 --galore-gap 200 --lr 2e-4" \
                      "--optim galore --galore-rank 128 --galore-gap 200 --lr 8e-4"; do
        echo "-- bert_mlm (BERT-base) $run_args"
        run "$BUILD/examples/bert_mlm" $base $run_args 2>&1 | tr '\r' '\n' | grep -E "mlm_loss|optimizer_state|^train:" | tail -5
      done ;;
    cuda-graph)  # issue 18: CudaGraph's GPU tests, then the small-batch rows eager and replayed against PyTorch eager
                 # (GRAPH_OPTIM=adamw: a capturable AdamW)
      run "$BUILD/tests/frugal_gpu_tests" -tc='*cuda graph*'
      rows=${GRAPH_ROWS:-resnet50-b16-amp,vit_b16-b16-amp,bert_base-b8-amp}
      run timeout ${TRAIN_STEP_TIMEOUT:-280} python3 tools/train_step_torch.py --frugal "$BUILD/bench/train_step" --rows "$rows" \
        --optim ${GRAPH_OPTIM:-sgd}
      run timeout ${TRAIN_STEP_TIMEOUT:-280} python3 tools/train_step_torch.py --frugal "$BUILD/bench/train_step" --rows "$rows" \
        --cuda-graph --optim ${GRAPH_OPTIM:-sgd} ;;
    gelu-mlp) run python3 tools/bench_gelu_mlp.py --frugal "$BUILD/bench/bench_gelu_mlp" ;;  # Note [GELU epilogues]
    profile) run "$BUILD/examples/profile_memory" --device cuda --out /tmp/profile ;;
    double-backward)  # a WGAN-GP critic step (grad with create_graph) against PyTorch, two sizes
      for size in "--batch 64 --width 512" "--batch 256 --width 2048"; do
        run "$BUILD/bench/bench_double_backward" --device cuda --steps 30 $size
        run python3 tools/bench_double_backward_torch.py --device cuda --steps 30 $size
      done ;;
    interpolate)  # interpolate's forward and backward per mode against PyTorch (bench_interpolate)
      run "$BUILD/bench/bench_interpolate" --device cuda
      run python3 tools/bench_interpolate_torch.py --device cuda ;;
    *) echo "unknown section $s"; rc=1 ;;
  esac
done
exit $rc
