// A DeepSpeed configuration file (`--deepspeed-config ds_config.json`, also
// spelled `--deepspeed_config` as Megatron-DeepSpeed passes it) translated into
// pretrain_gpt's flags, so a DeepSpeed user brings the JSON they have:
// batch sizes, gradient clipping, fp16 (dynamic or static loss scale) and bf16,
// zero_optimization (stage, bucket, overlap), activation_checkpointing (the
// paper's ZeRO-R: partition_activations = Pa, cpu_checkpointing = Pa+cpu,
// contiguous_memory_optimization = MD), the Adam/AdamW optimizer's parameters,
// the WarmupLR / WarmupDecayLR / WarmupCosineLR schedules (DeepSpeed's default
// logarithmic warmup or a linear one), and tensorboard.
//
// Every key is either translated, accepted with a note saying why it changes
// nothing here, or refused saying what megazero lacks (offload,
// sparse attention, ...); an unknown key is refused, so nothing in the file is
// silently ignored. "auto" (the Hugging Face Trainer's placeholder) keeps the
// command line's value. A value that contradicts a flag given on the command
// line is refused naming both.
#pragma once

#include <string>
#include <vector>

namespace megazero::train {

struct TrainArgs;

// Applies `json_text` (the file at `path`, for messages) to `a`. `given`: the
// flags (without dashes) the command line or --config file set explicitly.
// Throws ConfigError naming the file and key; notes go to a.notes.
void apply_deepspeed_config(TrainArgs& a, const std::string& json_text, const std::string& path,
                            const std::vector<std::string>& given);

}  // namespace megazero::train
