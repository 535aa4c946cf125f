// Megatron-LM flags in pretrain_gpt: a user's Megatron script should port by
// changing the executable name. Every Megatron flag is one of
//   - ours under the same name (arguments.cpp defines it);
//   - an accepted spelling of something we do (`--use-flash-attn` is
//     `--attention-backend fused`, `--use-distributed-optimizer` is ZeRO 1,
//     `--train-samples` becomes --train-iters, ...): translated after parsing;
//   - an implementation switch that has no meaning here (`--no-masked-softmax-fusion`,
//     `--num-workers`): accepted, and a note says why it changes nothing;
//   - a feature we do not have (`--sequence-parallel`, pipeline stages > 1):
//     refused with the reason.
// Unknown flags are all reported at once, each with a "did you mean".
#pragma once

#include <map>
#include <string>
#include <vector>

#include <boost/program_options.hpp>

namespace megazero::train {

struct TrainArgs;

// The Megatron spellings pretrain_gpt accepts (switches and valued flags);
// their values land in `given` (a switch as "true").
void define_megatron_flags(boost::program_options::options_description& group,
                           std::map<std::string, std::string>& given);

// Applies what the accepted Megatron flags mean to `a`, after parsing (so they
// can refer to the global batch and train iterations). `explicitly` are the
// flags the user gave (command line or file). Throws ConfigError on a
// contradiction (e.g. --use-flash-attn with --attention-backend unfused); adds
// a note per flag that changes nothing.
void apply_megatron_flags(TrainArgs& a, const std::map<std::string, std::string>& given,
                          const std::vector<std::string>& explicitly);

// One report of everything wrong with the flags: unknown names (with the
// nearest known name), Megatron features we refuse (with why), stray words.
// `known` are every flag name pretrain_gpt accepts.
struct FlagProblems {
  std::vector<std::string> unknown;  // names without "--"
  std::vector<std::string> stray;    // words that are not flags
  std::string where;                 // "" (command line) or "--config FILE"
};
std::string describe_flag_problems(const FlagProblems& p, const std::vector<std::string>& known);

// The name of a flag nearest to `name` (edit distance), or "" if none is close.
std::string nearest_flag(const std::string& name, const std::vector<std::string>& known);

}  // namespace megazero::train
