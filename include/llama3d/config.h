// Model and training configuration: Hugging Face config.json for the model, DeepSpeed's
// ds_config.json (plus llama3d's own sections) for the run.
// defines: l3d_model_config_t, l3d_train_config_t, l3d_model_config_*, l3d_train_config_*
#ifndef LLAMA3D_CONFIG_H
#define LLAMA3D_CONFIG_H

#include <stddef.h>
#include <stdint.h>

#include "llama3d/ctx.h"
#include "llama3d/status.h"

#ifdef __cplusplus
extern "C" {
#endif

// ---- model -------------------------------------------------------------------------------
// The Llama 3 architecture, field names as Hugging Face's LlamaConfig.
#define L3D_MAX_EOS 8

typedef struct l3d_model_config {
    char name[64];               // preset name, or "custom"
    int hidden_size;             // C
    int intermediate_size;       // F (SwiGLU width)
    int num_hidden_layers;       // L
    int num_attention_heads;     // H
    int num_key_value_heads;     // KVH (GQA); H % KVH == 0
    int head_dim;                // D = hidden_size / H unless config.json says otherwise
    int vocab_size;              // V
    int max_position_embeddings;
    float rms_norm_eps;
    float rope_theta;
    // rope_scaling {"rope_type": "llama3", factor, low_freq_factor, high_freq_factor,
    // original_max_position_embeddings}; rope_scaling_llama3 = 0 means no scaling.
    int rope_scaling_llama3;
    float rope_factor;
    float rope_low_freq_factor;
    float rope_high_freq_factor;
    int rope_original_max_position_embeddings;
    int tie_word_embeddings;
    int bos_token_id;
    int eos_token_id;            // the first of eos_token_ids (-1: none)
    // Every id that ends generation: config.json's eos_token_id may be a list (Llama 3.1
    // Instruct: 128001, 128008, 128009).
    int n_eos;
    int eos_token_ids[L3D_MAX_EOS];
    float initializer_range;     // std of the normal init of matrices (HF default 0.02)
} l3d_model_config_t;

// Fills `cfg` from a built-in preset: "llama3-tiny", "llama3.2-1b", "llama3.2-3b",
// "llama3-8b", "llama3-70b", "llama3-405b". Unknown: L3D_ERR_NOT_FOUND naming the presets.
l3d_status l3d_model_config_preset(l3d_ctx_t *ctx, const char *name, l3d_model_config_t *cfg);
// Lists the preset names, NULL-terminated.
const char *const *l3d_model_config_preset_names(void);
// Parses a Hugging Face config.json text. Unknown keys that HF writes (architectures,
// torch_dtype, ...) are ignored; keys that change the math and that llama3d does not do
// (e.g. attention_bias true, hidden_act other than silu) are L3D_ERR_CONFIG errors.
l3d_status l3d_model_config_from_json(l3d_ctx_t *ctx, const char *text, size_t len,
                                      const char *origin, l3d_model_config_t *cfg);
l3d_status l3d_model_config_from_file(l3d_ctx_t *ctx, const char *path, l3d_model_config_t *cfg);
// Checks internal consistency (divisibility, positivity). Error names the field.
l3d_status l3d_model_config_validate(l3d_ctx_t *ctx, const l3d_model_config_t *cfg);
// Writes a Hugging Face config.json that transformers' LlamaConfig loads. *json_p is
// allocated with malloc; free() it.
l3d_status l3d_model_config_to_json(l3d_ctx_t *ctx, const l3d_model_config_t *cfg, char **json_p);
// generation_config.json (transformers' GenerationConfig): the keys generation follows. An
// absent key is -1 (n_eos 0); eos_token_id may be one id or a list.
typedef struct l3d_generation_config {
    int bos_token_id;
    int n_eos;
    int eos_token_ids[L3D_MAX_EOS];
    int do_sample;             // 0 greedy, 1 sample
    float temperature, top_p, min_p, repetition_penalty;
    int top_k;
} l3d_generation_config_t;
void l3d_generation_config_default(l3d_generation_config_t *g);  // everything absent
// Bad JSON or a wrong type is L3D_ERR_CONFIG naming the file and the key.
l3d_status l3d_generation_config_from_file(l3d_ctx_t *ctx, const char *path,
                                           l3d_generation_config_t *g);

// Parameter count (embedding and head counted once when tied).
uint64_t l3d_model_config_num_params(const l3d_model_config_t *cfg);

// ---- training ----------------------------------------------------------------------------
typedef enum l3d_sched_type {
    L3D_SCHED_CONSTANT = 0,      // no "scheduler" section
    L3D_SCHED_WARMUP_LR,         // DeepSpeed WarmupLR: warm up, then hold warmup_max_lr
    L3D_SCHED_WARMUP_DECAY_LR,   // DeepSpeed WarmupDecayLR: warm up, then linear decay to 0
    L3D_SCHED_WARMUP_COSINE_LR,  // DeepSpeed WarmupCosineLR: warm up, then cosine decay
} l3d_sched_type;

#define L3D_MAX_NOTES 32

enum { L3D_BATCH_TRAIN = 1, L3D_BATCH_MICRO = 2, L3D_BATCH_ACCUM = 4 };
enum { L3D_SAVE_DTYPE_AUTO = 0, L3D_SAVE_DTYPE_F32 = 1, L3D_SAVE_DTYPE_BF16 = 2 };
#define L3D_SAVE_MAX_SHARD_DEFAULT 5000000000ull  // transformers' "5GB"

typedef struct l3d_train_config {
    l3d_model_config_t model;
    char model_source[512];      // preset name or path, as given
    char weights_dir[512];       // the model directory holds weights (model.safetensors or an
                                 // index and shards): training starts from them ("" = fresh
                                 // weights from train.seed)
    char origin[256];            // the ds_config.json read last ("" = none), for messages

    // batch identity (DeepSpeed): train_batch_size = micro * accum * dp
    int train_batch_size;
    int micro_batch_size;        // train_micro_batch_size_per_gpu
    int grad_accum_steps;        // gradient_accumulation_steps
    int batch_inferred;          // L3D_BATCH_* bits: which of the three are to be inferred
                                 // (0 in a file that was read, not yet resolved) or were by
                                 // the last finalize (it re-infers them after a dp change)

    float gradient_clipping;     // 0 = off
    int steps_per_print;
    int wall_clock_breakdown;

    // optimizer (DeepSpeed "optimizer": {"type": "AdamW"|"Adam", "params": {...}})
    float lr, beta1, beta2, eps, weight_decay;
    int adam_w_mode;             // 1: decoupled decay (AdamW); 0: L2 in the gradient (Adam)

    // scheduler (DeepSpeed "scheduler")
    l3d_sched_type sched;
    float warmup_min_lr, warmup_max_lr;
    int warmup_num_steps;
    int warmup_type_log;         // WarmupLR/WarmupDecayLR warmup_type "log" (DeepSpeed default)
    int total_num_steps;
    float warmup_min_ratio, cos_min_ratio;  // WarmupCosineLR

    // precision, memory (accepted; effective or reported as notes)
    // fp16.enabled / bf16.enabled: the training dtype (weights the passes read, activations and
    // their gradients) over float32 masters, weight gradients and optimizer state
    // (docs/precision.md); at most one of them
    int fp16, bf16;
    // fp16 loss scaling, DeepSpeed's keys and defaults (the rules: core/train/loss_scaler.h)
    double fp16_loss_scale;           // fp16.loss_scale: 0 = dynamic, > 0 a static scale
    int fp16_initial_scale_power;     // fp16.initial_scale_power: dynamic starts at 2^this (16)
    int fp16_loss_scale_window;       // fp16.loss_scale_window: clean steps per doubling (1000)
    int fp16_hysteresis;              // fp16.hysteresis: overflows per halving (2)
    int fp16_consecutive_hysteresis;  // fp16.consecutive_hysteresis: a clean step refills (0)
    double fp16_min_loss_scale;       // fp16.min_loss_scale: the floor (1)
    int zero_stage;
    int overlap_comm;
    double reduce_bucket_size;
    // The dtype data parallelism reduces gradients in (DeepSpeed's communication_data_type,
    // an l3d_dtype of llama3d/comm.h: L3D_FLOAT32, L3D_BFLOAT16 or L3D_FLOAT16; -1 unset: the
    // training dtype, as DeepSpeed), and fp32_allreduce (reduce in float32 whatever else says).
    int comm_dtype;
    int fp32_allreduce;
    // The dtype weight gradients accumulate in (DeepSpeed's data_types.grad_accum_dtype, an
    // l3d_dtype; -1 unset: float32). bf16 / fp16 only with that training dtype: the windows
    // (ZeRO-2/3) or the whole gradient (ZeRO-0/1) take 2 bytes an element, as DeepSpeed's
    // memory estimates count them, each addition rounding once (docs/precision.md).
    int grad_dtype;
    // ZeRO-3 (zero_optimization.stage3_*, DeepSpeed's defaults; core/train/trainer_zero3.c):
    // parameters gathered ahead of their use (5e7), gradient groups smaller than this stay
    // whole on every rank (1e5), parameters gathered at once (1e9) -- all in elements.
    double stage3_prefetch_bucket_size;
    double stage3_param_persistence_threshold;
    double stage3_max_live_parameters;
    int stage3_gather_16bit_weights_on_model_save;
    // ZeRO offload (zero_optimization.offload_optimizer / offload_param with device "cpu";
    // core/train/trainer_offload.c): the optimizer state, fp32 master pieces and the AdamW step in
    // host memory on host threads; ZeRO-3's parameter pieces in host memory. *_pin: pin_memory.
    int offload_optimizer, offload_optimizer_pin;
    int offload_param, offload_param_pin;
    int activation_checkpointing;
    // activation_checkpointing.partition_activations: each saved layer input keeps 1/tp of its
    // rows, all-gathered over tp for the recompute (tp > 1 without SP; SP splits them already);
    // cpu_checkpointing: the saved inputs live in host memory.
    int partition_activations, cpu_checkpointing;

    // llama3d's own sections
    char data_path[512];         // "" = the default data set
    char tokenizer_path[512];    // data.tokenizer: tokenizer.json, tokenizer.model or a
                                 // directory ("" = the model directory's, else bytes)
    char model_dir[512];         // the model came from this directory ("" = not one)
    int seq_len;                 // data.seq_len: T
    int steps;                   // train.steps
    uint64_t seed;               // train.seed
    char save_dir[512];          // train.save_dir ("" = no saving)
    int save_interval;           // train.save_interval (0 = only at the end)
    int save_consolidated;       // train.save_consolidated: a parallel run writes one HF
                                 // directory (else each rank writes its shard in parallel)
    int save_dtype;              // train.save_dtype: L3D_SAVE_DTYPE_* ("float32" |
                                 // "bfloat16"; default: what was loaded, float32 when fresh)
    uint64_t save_max_shard_size;  // train.save_max_shard_size: bytes per safetensors shard
                                   // (an integer or "5GB", "500MiB"; default 5 GB as HF)
    char metrics_path[512];      // train.metrics ("" = none)
    // DeepSpeed's monitors (tensorboard, csv_monitor): each enabled one writes under its
    // output_path/job_name on world rank 0 (llama3d/monitor.h). wandb is refused: no network.
    int tensorboard;             // tensorboard.enabled
    char tensorboard_dir[640];   // tensorboard.output_path joined with job_name
    int csv_monitor;             // csv_monitor.enabled
    char csv_monitor_dir[640];   // csv_monitor.output_path joined with job_name
    int dp, tp, pp;              // parallel section
    int dp_auto;                 // dp not given: a launcher's world size decides (world/(tp*pp))
    char parallel_order[16];     // parallel.order, fastest first ("" = "tp-dp-pp")
    char pp_schedule[16];        // parallel.schedule: "1f1b" (default), "gpipe", "interleaved"
    int virtual_stages;          // parallel.virtual_stages: model chunks per pipeline rank
                                 // (interleaved 1F1B; 0 = 2 when interleaved, else 1)
    int sequence_parallel;       // parallel.sequence_parallel (with tp > 1)
    int tp_mode;                 // parallel.tp_mode: 0/1 "1d" (Megatron), 2 "2d" (SUMMA on a
                                 // sqrt(tp) x sqrt(tp) grid), 3 "3d" (the cbrt(tp) cube of
                                 // Agarwal / Bian et al.; docs/parallel.md)
    int n_layers_per_stage;      // parallel.layers_per_stage: pp x virtual_stages entries,
                                 // one per virtual stage in model order (0 = balanced)
    int layers_per_stage[512];
    char device[32];             // train.device ("cpu")
    int allow_tf32;              // train.allow_tf32: float32 GEMMs on TF32 tensor cores (CUDA;
                                 // torch's allow_tf32; off by default, as torch's matmul is)
    int device_index;            // which GPU: the launcher's local rank (l3d launch, torchrun,
                                 // mpirun, srun: LOCAL_RANK and kin); 0 for ranks as threads
    int num_threads;             // train.threads (0 = L3D_NUM_THREADS or cores)

    // evaluation, shuffling and the MFU roof (docs/config.md)
    char eval_path[512];         // data.eval_path: a separate eval stream ("" = none)
    double eval_fraction;        // data.eval_fraction: the stream's held-out tail (0 = none)
    int eval_interval;           // train.eval_interval: evaluate every N steps (0 = never)
    int eval_iters;              // train.eval_iters: global batches per evaluation
    int eval_optional;           // the eval tail is l3d_train_config_job_defaults', not asked
                                 // for: data too short to hold it out trains on all of it,
                                 // without evaluation, instead of being refused
    int shuffle;                 // data.shuffle: the shuffled batching rule (core/train/data.h)
    int data_seed_set;           // data.seed given; otherwise the shuffle uses train.seed
    uint64_t data_seed;          // data.seed
    double peak_flops;           // train.peak_flops: FLOP/s of one rank's device, the MFU
                                 // roof (0 = none given: no MFU unless measured)

    // keys accepted but not yet effective here, one line each, printed at start-up
    int n_notes;
    char notes[L3D_MAX_NOTES][160];
} l3d_train_config_t;

// Defaults: llama3-tiny, batch 8 = micro 8 x accum 1, T 64, AdamW lr 1e-3, 200 steps, seed 1.
void l3d_train_config_default(l3d_ctx_t *ctx, l3d_train_config_t *cfg);
// Applies a ds_config.json text on top of `cfg`. Every key is honoured, noted in cfg->notes
// as not yet effective, or rejected with L3D_ERR_CONFIG naming the key, its path and the
// nearest valid key. The batch numbers are recorded (0: to be inferred), not yet resolved:
// the identity involves dp, which command-line flags or a launcher's world may still set.
// Likewise data.seq_len is not yet checked against the model (a flag may replace either).
l3d_status l3d_train_config_from_json(l3d_ctx_t *ctx, const char *text, size_t len,
                                      const char *origin, l3d_train_config_t *cfg);
l3d_status l3d_train_config_from_file(l3d_ctx_t *ctx, const char *path, l3d_train_config_t *cfg);
// Once the file, the overrides and dp, tp, pp are all known: checks seq_len against the
// model's max_position_embeddings, resolves the batch identity with DeepSpeed's rules (any
// two of the three numbers determine the third with dp; a mismatch is an error naming all
// three, dp and the fix) and checks the layout against the model, the
// pipeline schedule and the device, the same checks l3d_trainer_create_parallel makes.
l3d_status l3d_train_config_finalize(l3d_ctx_t *ctx, l3d_train_config_t *cfg);
// llama3d's own schedule and evaluation, for a run given no ds_config.json (`l3d train` with
// flags only; docs/config.md, "Without a config file"): WarmupCosineLR over cfg->steps -- a
// linear warm-up from 0 over 10% of the steps (at least 5, at most half), then cosine to 10%
// of the optimizer's lr at the last step -- and the data's last 10% held out, evaluated every
// 50 steps and after the last on 4 batches (optional: too short a data set trains without
// it). Call once cfg->steps is final: the schedule spans it. Not for a run that read a
// ds_config.json: there, as in DeepSpeed, no scheduler section means a constant lr, and no
// eval keys no eval.
void l3d_train_config_job_defaults(l3d_train_config_t *cfg);
// Learning rate at optimizer step `step` (0-based) for the configured schedule.
float l3d_train_config_lr(const l3d_train_config_t *cfg, int step);

#ifdef __cplusplus
}
#endif
#endif
