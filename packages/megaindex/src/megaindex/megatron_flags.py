"""Megatron-LM's flags that do not shape a dataset cache, for ``mega index build``.

tools/prepare_cache.py parses a whole training command line with Megatron-LM's own parser
(model size, optimizer, checkpointing, logging, ...): its argument validation even requires
``--num-layers``, ``--hidden-size``, ``--num-attention-heads`` and
``--max-position-embeddings``, and none of these reach the cache. So that a job's command line
runs unchanged here, each such flag is taken with whatever values follow it and ignored.

The names are those of the seed commit's parser, less the flags ``mega index build`` reads
itself and less the few it leaves unrecognised because the tool refuses them or they would
change the data (``--encoder-seq-length``, ``--decoder-seq-length``, ``--batch-size``,
``--model-parallel-size``, ``--fim-data``, ``--sft``, ``--yaml-cfg``).
tests/compat/test_prepare_cache_compat.py checks the list against the seed's parser.
"""

from __future__ import annotations

import argparse

#: the flags taken and ignored (names only: each takes the values that follow it, as none of
#: Megatron-LM's values starts with ``--`` and its parser has no positional arguments)
IGNORED_FLAGS: tuple[str, ...] = tuple(
    """
--account-for-embedding-in-pipeline-split --account-for-loss-in-pipeline-split
--accumulate-allreduce-grads-in-fp32 --activation-func-clamp-value --adam-beta1 --adam-beta2
--adam-eps --add-qkv-bias --adlr-autoresume --adlr-autoresume-interval --app-tag-run-name
--app-tag-run-version --apply-layernorm-1p --apply-query-key-layer-scaling
--apply-residual-connection-post-layernorm --apply-wd-to-qk-layernorm
--async-ckpt-cpu-priority --async-ckpt-io-priority --async-ckpt-use-cpu-shm --async-save
--async-strategy --attention-backend --attention-dropout --attention-output-gate
--attention-softmax-in-fp32 --auto-detect-ckpt-format --batch-invariant-mode
--bert-embedder-type --bert-load --bert-no-binary-head --bf16 --biencoder-projection-dim
--biencoder-shared-query-context-model --block-data-path --cache-mla-latents
--calc-ft-timeouts --calculate-per-token-loss --check-for-large-grads --check-for-spiky-loss
--check-weight-hash-across-dp-replicas-interval --checkpoint-activations
--ckpt-assume-constant-structure --ckpt-convert-format --ckpt-convert-save
--ckpt-convert-update-legacy-dist-opt-format --ckpt-format --ckpt-fully-parallel-load
--ckpt-fully-parallel-load-exchange-algo --ckpt-fully-parallel-load-process-group
--ckpt-fully-parallel-save --ckpt-fully-parallel-save-process-group --ckpt-step
--classes-fraction --clip-grad --config-logger-dir --cp-comm-type
--cpu-offloading-num-layers --cpu-offloading-retain-pinned-cpu-buffers
--create-all-gather-group --cross-entropy-fusion-impl --cross-entropy-loss-fusion
--cuda-graph-impl --cuda-graph-modules --cuda-graph-scope --cuda-graph-warmup-steps
--data-parallel-random-init --data-parallel-sharding-strategy --data-per-class-fraction
--dataloader-type --ddp-average-in-collective --ddp-bucket-size --ddp-num-buckets
--ddp-pad-buckets-for-high-nccl-busbw --ddp-param-name-patterns-for-fp32-local-accumulation
--ddp-reduce-scatter-with-fp32-accumulation --decode-only-cuda-graphs
--decoder-first-pipeline-num-layers --decoder-last-pipeline-num-layers --decoder-num-layers
--decoupled-lr --decoupled-min-lr --decrease-batch-size-if-needed
--defer-embedding-wgrad-compute --delay-wgrad-compute --deterministic-mode
--dino-bottleneck-size --dino-freeze-last-layer --dino-head-hidden-size
--dino-local-crops-number --dino-local-img-size --dino-norm-last-layer --dino-teacher-temp
--dino-warmup-teacher-temp --dino-warmup-teacher-temp-epochs --disable-align-grad-reduce
--disable-bf16-reduced-precision-matmul --disable-bias-linear
--disable-ckpt-load-validate-sharding-integrity --disable-clone-scatter-output-in-embedding
--disable-flight-recorder-dump-on-timeout --disable-flight-recorder-extra-dump-on-exec
--disable-flight-recorder-include-only-active --disable-fp8-wgrad
--disable-gloo-process-groups --disable-jit-fuser --disable-log-loss-scale-to-tensorboard
--disable-mamba-mem-eff-path --disable-manual-gc-eval --disable-msc
--disable-straggler-on-startup --disable-strict-fsdp-dtensor-load
--disable-symmetric-registration --disable-tp-comm-bulk-dgrad --disable-tp-comm-bulk-wgrad
--disable-tp-comm-overlap-ag --disable-tp-comm-overlap-rs --disable-tp-comm-split-ag
--disable-tp-comm-split-rs --disable-use-tokenizer-model-from-checkpoint-args
--dist-ckpt-format --dist-ckpt-optim-fully-reshardable --dist-ckpt-save-pre-mcore-014
--dist-ckpt-strictness --dist-ckpt-workers --distrib-optim-fully-reshardable-mem-efficient
--distribute-saved-activations --distributed-backend --distributed-timeout-minutes
--distributed-timeout-seconds-after-init --dsa-indexer-head-dim --dsa-indexer-loss-coeff
--dsa-indexer-n-heads --dsa-indexer-topk --dsa-indexer-use-sparse-loss
--dump-param-to-param-group-map --embedding-init-method-std --embedding-path
--empty-unused-memory-level --enable-chunked-prefill --enable-cuda-graph
--enable-experimental --enable-ft-package --enable-full-sharding-in-hsdp --enable-gpt-oss
--enable-msc --encoder-num-layers --end-weight-decay --ep-overlap-early-attn-memory-release
--error-injection-rate --error-injection-type --eval-micro-batch-size --evidence-data-path
--exit-duration-in-mins --exit-interval --exit-on-missing-checkpoint --exit-signal
--exit-signal-handler --exit-signal-handler-for-dataloader
--exit-signal-handler-for-training --exp-avg-dtype --exp-avg-sq-dtype
--experimental-attention-variant --expert-model-parallel-size --expert-tensor-parallel-size
--export-default-te-spec --export-force-local-attention --export-kd-cfg
--export-kd-teacher-ckpt-format --export-kd-teacher-load --export-kd-teacher-model-config
--export-kv-cache-quant --export-legacy-megatron --export-model-type
--export-moe-apply-probs-on-input --export-offline-model --export-qk-l2-norm
--export-quant-cfg --export-real-quant-cfg --export-te-mcore-model --external-cuda-graph
--fake-process-group --fault-injector-delay-start-iteration --fault-injector-fault-delay
--fault-injector-fault-probabilities --fault-injector-fault-types
--fault-injector-mtti-seconds --fault-injector-num-ranks --fault-injector-offset-seconds
--fault-injector-ranks --fault-injector-seed --ffn-hidden-size
--fine-grained-activation-offloading --fine-grained-offloading-max-inflight-offloads
--finetune --finetune-data-split --finetune-hf-dataset --first-last-layers-bf16
--flash-decode --flight-recorder-dump-path --flight-recorder-include-stack-trace
--flight-recorder-trace-buffer-size --fp16 --fp16-lm-cross-entropy
--fp32-residual-connection --fp4-format --fp4-param-gather --fp4-quantizer-factory
--fp4-recipe --fp8-amax-compute-algo --fp8-amax-history-len --fp8-format --fp8-interval
--fp8-margin --fp8-output-proj --fp8-param-gather --fp8-quantizer-factory --fp8-recipe
--fsdp-double-buffer --fsdp-manual-registration --ft-num-warmup-iters
--fused-residual-rmsnorm --glu-linear-offset --gpu-sniff-test-interval --grad-reduce-in-bf16
--group-query-attention --grpo-clamp-eps-lower --grpo-clamp-eps-upper
--grpo-entropy-term-weight --grpo-filter-groups-with-same-reward --grpo-group-size
--grpo-iterations --grpo-kl-beta --grpo-prompts-per-step --head-lr-mult
--heterogeneous-layers-config-encoded-json --heterogeneous-layers-config-path
--hidden-dropout --hidden-size --hierarchical-context-parallel-sizes
--high-priority-a2a-comm-stream --high-priority-stream-groups --hybrid-layer-pattern
--hybrid-override-pattern --hysteresis --ict-head-size --ict-load --img-h --img-w
--indexer-batch-size --indexer-log-interval --inference-batch-times-seqlen-threshold
--inference-coordinator-port --inference-cuda-graph-all-prefills
--inference-cuda-graph-scope --inference-disable-ep-consensus
--inference-disable-triton-nvls-kernels --inference-dynamic-batching
--inference-dynamic-batching-block-size --inference-dynamic-batching-buffer-size-gb
--inference-dynamic-batching-cuda-graph-mixed-prefill-count
--inference-dynamic-batching-cuda-graph-sizing-distribution
--inference-dynamic-batching-mamba-memory-ratio --inference-dynamic-batching-max-requests
--inference-dynamic-batching-max-tokens --inference-dynamic-batching-num-cuda-graphs
--inference-dynamic-batching-paused-buffer-size-gb
--inference-dynamic-batching-prefix-caching
--inference-dynamic-batching-prefix-caching-coordinator-policy
--inference-dynamic-batching-prefix-caching-eviction-policy
--inference-dynamic-batching-prefix-caching-mamba-gb
--inference-dynamic-batching-prefix-caching-routing-alpha
--inference-dynamic-batching-sampling-backend
--inference-dynamic-batching-track-generated-token-events
--inference-dynamic-batching-track-paused-request-events
--inference-dynamic-batching-unified-memory-level --inference-fuse-tp-communication
--inference-grouped-gemm-backend --inference-logging-step-interval --inference-max-requests
--inference-max-seq-length --inference-moe-disable-fused-quant-kernels
--inference-moe-token-dispatcher-type --inference-rng-tracker
--inference-text-gen-server-logging --inference-use-synchronous-zmq-collectives
--inference-wandb-logging --init-method-std --init-method-xavier-uniform
--init-model-with-meta-device --initial-loss-scale --inprocess-active-world-size
--inprocess-barrier-timeout --inprocess-completion-timeout --inprocess-empty-cuda-cache
--inprocess-granularity --inprocess-hard-timeout --inprocess-heartbeat-interval
--inprocess-heartbeat-timeout --inprocess-last-call-wait --inprocess-max-iterations
--inprocess-monitor-process-interval --inprocess-monitor-thread-interval
--inprocess-progress-watchdog-interval --inprocess-restart --inprocess-soft-timeout
--inprocess-termination-grace-time --is-hybrid-model --iter-per-epoch --iterations-to-skip
--keep-fp8-transpose-cache --kitchen-attention-backend --kv-channels --kv-lora-rank
--langrl-env-config --lazy-mpu-init --linear-attention-freq --linear-conv-kernel-dim
--linear-key-head-dim --linear-num-key-heads --linear-num-value-heads
--linear-value-head-dim --lion-beta1 --lion-beta2 --load --load-main-params-from-ckpt
--local-rank --log-device-memory-used --log-energy --log-interval --log-max-attention-logit
--log-memory-interval --log-memory-to-tensorboard --log-num-zeros-in-grad --log-params-norm
--log-progress --log-straggler --log-throughput --log-timers-to-tensorboard
--log-validation-ppl-to-tensorboard --log-world-size-to-tensorboard --logging-level
--loss-scale --loss-scale-window --lr --lr-decay-iters --lr-decay-samples --lr-decay-style
--lr-warmup-fraction --lr-warmup-init --lr-warmup-iters --lr-warmup-samples
--lr-wsd-decay-iters --lr-wsd-decay-samples --lr-wsd-decay-style --main-grads-dtype
--main-params-dtype --mamba-head-dim
--mamba-inference-conv-states-dtype --mamba-inference-ssm-states-dtype --mamba-num-groups
--mamba-num-heads --mamba-state-dim --manual-gc --manual-gc-interval --mask-factor
--mask-prob --mask-type --max-position-embeddings --max-seqlen-per-dp-cp-rank
--max-tokens-to-oom --megatron-fsdp-enable-fine-grained-param-gather
--megatron-fsdp-grad-comm-dtype --megatron-fsdp-main-grads-dtype
--megatron-fsdp-main-params-dtype --memory-snapshot-path
--microbatch-group-size-per-virtual-pipeline-stage --min-loss-scale --min-lr
--min-offloaded-tensor-size --mla-down-proj-fusion --mlp-chunks-for-prefill
--mlp-chunks-for-training --modelopt-enabled --moe-apply-probs-on-input --moe-aux-loss-coeff
--moe-deepep-num-sms --moe-enable-deepep --moe-enable-routing-replay
--moe-expert-capacity-factor --moe-expert-rank-capacity-factor --moe-ffn-hidden-size
--moe-flex-dispatcher-backend --moe-grouped-gemm --moe-hybridep-num-blocks-permute
--moe-hybridep-num-blocks-unpermute --moe-hybridep-num-sms
--moe-hybridep-num-sms-preprocessing --moe-input-jitter-eps --moe-latent-size
--moe-layer-freq --moe-layer-recompute --moe-mlp-glu-interleave-size
--moe-pad-expert-input-to-capacity --moe-pad-experts-for-cuda-graph-inference
--moe-paged-stash --moe-paged-stash-buffer-size-factor-cpu
--moe-paged-stash-buffer-size-factor-cuda --moe-paged-stash-page-size
--moe-per-layer-logging --moe-permute-fusion --moe-permute-fusion-into-hybridep
--moe-router-bias-update-rate --moe-router-dtype --moe-router-enable-expert-bias
--moe-router-force-biased --moe-router-force-load-balancing --moe-router-fusion
--moe-router-group-topk --moe-router-load-balancing-type --moe-router-num-groups
--moe-router-padding-for-fp8 --moe-router-padding-for-quantization --moe-router-pre-softmax
--moe-router-score-function --moe-router-topk --moe-router-topk-scaling-factor
--moe-shared-expert-gate --moe-shared-expert-intermediate-size --moe-shared-expert-overlap
--moe-single-grouped-bias --moe-single-grouped-weight --moe-token-dispatcher-type
--moe-token-drop-policy --moe-upcycling-granularity --moe-use-upcycling --moe-z-loss-coeff
--mrope-section --mscale --mscale-all-dim --mtp-detach-heads --mtp-hybrid-override-pattern
--mtp-loss-scaling-factor --mtp-num-layers --mtp-standalone --mtp-use-repeated-layer
--multi-latent-attention --muon-coefficient-type --muon-extra-scale-factor
--muon-fp32-matmul-prec --muon-momentum --muon-nesterov --muon-no-split-qkv
--muon-num-ns-steps --muon-scalar-optimizer --muon-scale-mode --muon-tp-mode
--mup-attn-scale-power --mup-base-head-dim --mup-base-hidden-size --mup-embedding-mult
--mup-output-mult --mup-width-mult --nccl-all-reduce-for-prefill
--nccl-communicator-config-path --no-align-grad-reduce --no-align-param-gather
--no-barrier-with-level-1-timing --no-bias-dropout-fusion --no-bias-gelu-fusion
--no-bias-swiglu-fusion --no-check-for-nan-in-loss-and-grad --no-ckpt-fully-parallel-save
--no-ckpt-load-validate-sharding-integrity --no-clone-scatter-output-in-embedding
--no-data-sharding --no-flight-recorder-dump-on-timeout
--no-flight-recorder-extra-dump-on-exec --no-flight-recorder-include-only-active
--no-fp8-wgrad --no-gradient-accumulation-fusion --no-gradient-reduce-div-fusion
--no-inference-disable-ep-consensus --no-inference-dynamic-batching-prefix-caching
--no-inference-text-gen-server-logging --no-inference-use-synchronous-zmq-collectives
--no-inference-wandb-logging --no-initialization --no-load-optim --no-load-rng
--no-log-loss-scale-to-tensorboard --no-manual-gc-eval --no-masked-softmax-fusion
--no-one-logger --no-overlap-p2p-communication --no-persist-layer-norm --no-pin-cpu-grads
--no-pin-cpu-params --no-position-embedding --no-rl-inference-logprobs-is-correction
--no-rl-offload-inference-model-weights-when-idle --no-rl-partial-rollouts
--no-rl-persist-cuda-graphs --no-rl-skip-bos-token --no-rl-training-cuda-graphs
--no-rl-use-sequence-packing --no-rl-verify-model-weights-swap --no-rope-freq
--no-rope-fusion --no-save-optim --no-save-rng --no-strict-fsdp-dtensor-load
--no-tp-comm-bulk-dgrad --no-tp-comm-bulk-wgrad --no-tp-comm-overlap-ag
--no-tp-comm-overlap-rs --no-tp-comm-split-ag --no-tp-comm-split-rs
--no-use-layer-wise-param-layout --no-use-tokenizer-model-from-checkpoint-args
--no-weight-decay-cond-type --non-persistent-ckpt-type --non-persistent-global-ckpt-dir
--non-persistent-local-ckpt-algo --non-persistent-local-ckpt-dir
--non-persistent-save-interval --norm-epsilon --normalization --num-attention-heads
--num-channels --num-classes --num-distributed-optimizer-instances --num-experts
--num-layers --num-layers-at-end-in-bf16 --num-layers-at-start-in-bf16
--num-layers-per-virtual-pipeline-stage --num-query-groups --num-speculative-tokens
--num-virtual-stages-per-pipeline-rank --num-workers --nvtx-ranges --offload-modules
--one-logger-async --one-logger-project --one-logger-run-name --onnx-safe --openai-gelu
--optimizer --optimizer-cpu-offload --optimizer-cuda-graph --optimizer-offload-fraction
--outer-dp-sharding-strategy --output-bert-embeddings --overlap-cpu-optimizer-d2h-h2d
--overlap-dispatch-backward-with-experts-wgrad --overlap-grad-reduce
--overlap-moe-expert-parallel-comm --overlap-p2p-communication-warmup-flush
--overlap-param-gather --overlap-param-gather-with-optimizer-step
--override-opt-param-scheduler --override-opt_param-scheduler --patch-dim --perform-rl-step
--persistent-save-interval --pipeline-model-parallel-comm-backend
--pipeline-model-parallel-layout --position-embedding-type --pretrained-checkpoint --profile
--profile-ranks --profile-step-end --profile-step-start --pytorch-profiler-collect-callstack
--pytorch-profiler-collect-chakra --pytorch-profiler-collect-shapes --q-lora-rank --qk-clip
--qk-clip-alpha --qk-clip-threshold --qk-head-dim --qk-l2-norm --qk-layernorm
--qk-pos-emb-head-dim --query-in-block-prob --quick-geglu --recompute-activations
--recompute-granularity --recompute-method --recompute-modules --recompute-num-layers
--record-memory-history --record-shapes --refit-method --relative-attention-max-distance
--relative-attention-num-buckets --replication --replication-factor --replication-jump
--rerun-mode --result-rejected-tracker-filename --retriever-report-topk-accuracies
--retriever-score-scaling --reuse-grad-buf-for-mxfp8-param-ag --rl-default-temperature
--rl-default-top-k --rl-default-top-p --rl-generation-batch-size
--rl-importance-sampling-truncation-coef --rl-inference-expert-model-parallel-size
--rl-inference-expert-tensor-model-parallel-size --rl-inference-logprobs-is-correction
--rl-inference-model-unified-memory-level --rl-inference-parsers
--rl-inference-pipeline-model-parallel-size --rl-inference-tensor-model-parallel-size
--rl-kv-cache-management-mode --rl-num-parallel-generation-batches
--rl-num-parallel-generations --rl-offload-inference-model-weights-when-idle
--rl-offload-optimizer-during-inference --rl-parallel-generation-tasks --rl-partial-rollouts
--rl-persist-cuda-graphs --rl-prompts-per-eval --rl-sequence-packing-algo
--rl-sequence-packing-max-sequences-per-bin --rl-skip-bos-token --rl-training-cuda-graphs
--rl-use-sequence-packing --rl-verify-model-weights-swap --rope-scaling-factor --rope-type
--rotary-base --rotary-interleaved --rotary-percent --rotary-scaling-factor
--rotary-seq-len-interpolation-factor --run-workload-inspector-server --sample-rate --save
--save-activations-interval --save-dgrads-interval --save-interval --save-params-interval
--save-retain-interval --save-tokens-per-expert-interval --save-wgrads-interval
--sgd-momentum --sharp-enabled-group --short-seq-prob --softmax-type --spec --squared-relu
--start-weight-decay --straggler-ctrlr-port --straggler-minmax-count
--suggested-communication-unit-size --swiglu --swin-backbone-type --symmetric-ar-type
--te-precision-config-file --te-rng-tracker --tensorboard-dir --tensorboard-log-interval
--tensorboard-queue-size --test-mode --timing-log-level --timing-log-option
--titles-data-path --torch-fsdp2-no-reshard-after-forward --tp-comm-bootstrap-backend
--tp-comm-overlap --tp-comm-overlap-cfg --tp-comm-overlap-rs-dgrad --train-sync-interval
--transformer-impl --untie-embeddings-and-output-weights --use-checkpoint-args
--use-checkpoint-opt-param-scheduler --use-checkpoint-opt_param-scheduler
--use-cpu-initialization --use-dist-ckpt --use-distributed-optimizer --use-flash-attn
--use-fused-weighted-squared-relu --use-grouped-gemm-for-dense-mlp --use-kitchen-attention
--use-legacy-static-engine --use-mcore-models --use-megatron-fsdp
--use-mp-args-from-checkpoint-args --use-mup --use-nccl-ub --use-one-sent-docs
--use-persistent-ckpt-worker --use-precision-aware-optimizer --use-pytorch-profiler
--use-ring-exchange-p2p --use-rope-scaling --use-rotary-position-embeddings --use-sharp
--use-te-activation-func --use-torch-fsdp2 --use-torch-optimizer-for-cpu-offload
--use-tp-pp-dp-mapping --use-transformer-engine-op-fuser --v-head-dim --validation-set-names
--verify-integrity --vision-backbone-type --vision-pretraining --vision-pretraining-type
--wandb-entity --wandb-exp-name --wandb-project --wandb-save-dir --warmup --weight-decay
--weight-decay-incr-style --wgrad-deferral-limit --window-attn-skip-freq --window-size
""".split()  # noqa: SIM905 (700 names, one string reads better than a list)
)

#: the flags Megatron-LM's argument validation requires of every job (named in ``--help``)
REQUIRED_MODEL_FLAGS = (
    "--num-layers",
    "--hidden-size",
    "--num-attention-heads",
    "--max-position-embeddings",
)


def add_ignored_megatron_flags(parser: argparse.ArgumentParser) -> None:
    """Take every flag of :data:`IGNORED_FLAGS` that ``parser`` does not read itself, values
    and all, into one hidden destination; ``--help`` says so in one group."""
    group = parser.add_argument_group(
        "Megatron-LM's other flags (taken and ignored)",
        f"a training job's model, optimizer, checkpointing, logging, ... flags "
        f"({', '.join(REQUIRED_MODEL_FLAGS)}, ...), as tools/prepare_cache.py's command line "
        "has them: accepted with their values and ignored, since they do not shape the cache",
    )
    for flag in IGNORED_FLAGS:
        try:
            group.add_argument(
                flag,
                nargs="*",
                action="append",
                dest="ignored_megatron_flags",
                help=argparse.SUPPRESS,
            )
        except argparse.ArgumentError:  # a flag this parser reads itself
            continue
