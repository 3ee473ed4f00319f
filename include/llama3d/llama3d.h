// llama3d: Llama 3 training and inference with data, tensor and pipeline parallelism.
// The umbrella header; see each for its contract.
#ifndef LLAMA3D_H
#define LLAMA3D_H

#include "llama3d/status.h"
#include "llama3d/ctx.h"
#include "llama3d/config.h"
#include "llama3d/device.h"
#include "llama3d/model.h"
#include "llama3d/sampler.h"
#include "llama3d/serve.h"
#include "llama3d/train.h"
#include "llama3d/plan.h"
#include "llama3d/monitor.h"
#include "llama3d/tokenizer.h"

#define LLAMA3D_VERSION_MAJOR 0
#define LLAMA3D_VERSION_MINOR 1
#define LLAMA3D_VERSION_PATCH 0

#endif
