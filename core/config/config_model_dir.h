// What a model directory holds, as the config reads it: `model` may name a directory whose
// config.json describes the model and whose weights (Hugging Face files or a sharded llama3d
// checkpoint) training starts from. The file names are the checkpoint formats'
// (core/checkpoint/checkpoint_hf.h, core/checkpoint/checkpoint_dist.h); they are here, below both,
// because the
// config decides from them where a run starts, and the checkpoint code includes this header.
// defines: L3D_HF_WEIGHTS, L3D_HF_INDEX, L3D_CKPT_DIST_MANIFEST, l3d_hf_is_weights_dir,
//          l3d_ckpt_dist_is
#ifndef L3D_CONFIG_MODEL_DIR_H
#define L3D_CONFIG_MODEL_DIR_H

#define L3D_HF_WEIGHTS "model.safetensors"
#define L3D_HF_INDEX "model.safetensors.index.json"
#define L3D_CKPT_DIST_MANIFEST "shards.json"

// Whether `dir` holds model weights in Hugging Face layout (model.safetensors or the index).
int l3d_hf_is_weights_dir(const char *dir);
// 1 when dir holds a sharded checkpoint (its shards.json exists).
int l3d_ckpt_dist_is(const char *dir);

#endif
