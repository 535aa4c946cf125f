// Human and machine renderings of a Topology, for `--print-topology`-style tools
// and for logs: a table to read, and JSON for scripts (hand-written, since no
// JSON library is a dependency).
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "parallel_state/topology.h"

namespace megazero::parallel_state {

// "world 400 = TP 16 x DP 25 on 25 nodes of 16 ranks"
std::string summary_line(const Topology& topo);

// The summary line, any warnings, one row per rank (rank, node, local_rank,
// tp_rank, dp_rank), then the TP and DP groups with the nodes they touch.
std::string to_table(const Topology& topo, const std::vector<std::string>& hosts = {});

// One JSON object with keys world_size, tensor_model_parallel_size,
// data_parallel_size, ranks_per_node, num_nodes, grid (the dimensions, fastest
// first), warnings, ranks, tp_groups, dp_groups.
std::string to_json(const Topology& topo);

// A JSON string literal (with the quotes) for any bytes; control characters
// become escapes, other bytes pass through (UTF-8 stays UTF-8).
std::string json_quote(std::string_view s);

}  // namespace megazero::parallel_state
