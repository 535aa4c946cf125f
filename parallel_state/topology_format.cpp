#include "parallel_state/topology_format.h"

#include <algorithm>
#include <cstdio>
#include <iomanip>
#include <sstream>
#include <vector>

namespace megazero::parallel_state {
namespace {

std::string plural(int n, const char* word) { return std::to_string(n) + " " + word + (n == 1 ? "" : "s"); }

// "0-15" for a contiguous run, "0 16 32" otherwise: TP groups read as ranges,
// DP groups (stride t) show every member. Input is ascending.
std::string compact(const std::vector<int>& v) {
  std::ostringstream os;
  for (std::size_t i = 0; i < v.size();) {
    std::size_t j = i;
    while (j + 1 < v.size() && v[j + 1] == v[j] + 1) ++j;
    os << (i ? " " : "");
    if (j - i >= 1) {
      os << v[i] << "-" << v[j];
    } else {
      os << v[i];
    }
    i = j + 1;
  }
  return os.str();
}

std::vector<int> nodes_of(const Topology& topo, const std::vector<int>& ranks) {
  std::vector<int> nodes;
  for (int r : ranks) nodes.push_back(topo.node_of(r));
  std::sort(nodes.begin(), nodes.end());
  nodes.erase(std::unique(nodes.begin(), nodes.end()), nodes.end());
  return nodes;
}

void print_groups(std::ostringstream& os, const Topology& topo, const char* name,
                  const std::vector<std::vector<int>>& groups, const char* colour) {
  const std::size_t members = groups.empty() ? 0 : groups.front().size();
  os << name << " groups: " << plural(static_cast<int>(groups.size()), "group") << " of "
     << plural(static_cast<int>(members), "rank") << " (group index = " << colour << ")\n";
  const int width = static_cast<int>(std::to_string(groups.size() - 1).size());
  for (std::size_t g = 0; g < groups.size(); ++g) {
    const std::vector<int> nodes = nodes_of(topo, groups[g]);
    os << "  " << name << " " << std::setw(width) << g << ": ranks " << compact(groups[g]) << "  ("
       << (nodes.size() == 1 ? "node " : "nodes ") << compact(nodes);
    if (nodes.size() > 1) os << ", " << nodes.size() << " nodes";
    os << ")\n";
  }
}

void json_int_array(std::ostringstream& os, const std::vector<int>& v) {
  os << "[";
  for (std::size_t i = 0; i < v.size(); ++i) os << (i ? ", " : "") << v[i];
  os << "]";
}

void json_groups(std::ostringstream& os, const char* key, const std::vector<std::vector<int>>& groups, bool last) {
  os << "  \"" << key << "\": [\n";
  for (std::size_t g = 0; g < groups.size(); ++g) {
    os << "    ";
    json_int_array(os, groups[g]);
    os << (g + 1 < groups.size() ? ",\n" : "\n");
  }
  os << "  ]" << (last ? "\n" : ",\n");
}

}  // namespace

std::string summary_line(const Topology& topo) {
  std::ostringstream os;
  os << "world " << topo.world_size() << " = TP " << topo.tensor_model_parallel_size() << " x DP "
     << topo.data_parallel_size() << " on " << plural(topo.num_nodes(), "node") << " of "
     << plural(topo.ranks_per_node(), "rank");
  return os.str();
}

std::string to_table(const Topology& topo, const std::vector<std::string>& hosts) {
  std::ostringstream os;
  os << summary_line(topo) << "\n";
  for (const std::string& w : topo.warnings()) os << "warning: " << w << "\n";

  // Every column is at least as wide as its header and as the largest rank;
  // the host column (live jobs only) as wide as the longest host name.
  const bool with_hosts = !hosts.empty();
  const int digits = static_cast<int>(std::to_string(topo.world_size() - 1).size());
  const char* headers[] = {"rank", "node", "local_rank", "tp_rank", "dp_rank"};
  int widths[5];
  int host_width = 4;
  for (const auto& h : hosts) host_width = std::max(host_width, static_cast<int>(h.size()));
  for (int c = 0; c < 5; ++c) {
    widths[c] = std::max(digits, static_cast<int>(std::char_traits<char>::length(headers[c])));
    os << (c ? "  " : "") << std::setw(widths[c]) << headers[c];
    if (c == 0 && with_hosts) os << "  " << std::left << std::setw(host_width) << "host" << std::right;
  }
  os << "\n";
  for (int r = 0; r < topo.world_size(); ++r) {
    const RankCoord c = topo.coord(r);
    const int values[] = {c.rank, c.node, c.local_rank, c.tp_rank, c.dp_rank};
    for (int k = 0; k < 5; ++k) {
      os << (k ? "  " : "") << std::setw(widths[k]) << values[k];
      if (k == 0 && with_hosts)
        os << "  " << std::left << std::setw(host_width) << hosts[static_cast<std::size_t>(r)] << std::right;
    }
    os << "\n";
  }
  print_groups(os, topo, "TP", topo.tp_groups(), "dp_rank");
  print_groups(os, topo, "DP", topo.dp_groups(), "tp_rank");
  return os.str();
}

std::string to_json(const Topology& topo) {
  std::ostringstream os;
  os << "{\n"
     << "  \"world_size\": " << topo.world_size() << ",\n"
     << "  \"tensor_model_parallel_size\": " << topo.tensor_model_parallel_size() << ",\n"
     << "  \"data_parallel_size\": " << topo.data_parallel_size() << ",\n"
     << "  \"ranks_per_node\": " << topo.ranks_per_node() << ",\n"
     << "  \"num_nodes\": " << topo.num_nodes() << ",\n";
  os << "  \"grid\": [";
  const auto& dims = topo.grid().dims();
  for (std::size_t i = 0; i < dims.size(); ++i)
    os << (i ? ", " : "") << "{\"name\": " << json_quote(dims[i].name) << ", \"size\": " << dims[i].size << "}";
  os << "],\n";
  os << "  \"warnings\": [";
  const auto& warnings = topo.warnings();
  for (std::size_t i = 0; i < warnings.size(); ++i) os << (i ? ", " : "") << json_quote(warnings[i]);
  os << "],\n";
  os << "  \"ranks\": [\n";
  for (int r = 0; r < topo.world_size(); ++r) {
    const RankCoord c = topo.coord(r);
    os << "    {\"rank\": " << c.rank << ", \"node\": " << c.node << ", \"local_rank\": " << c.local_rank
       << ", \"tp_rank\": " << c.tp_rank << ", \"dp_rank\": " << c.dp_rank << "}"
       << (r + 1 < topo.world_size() ? ",\n" : "\n");
  }
  os << "  ],\n";
  json_groups(os, "tp_groups", topo.tp_groups(), false);
  json_groups(os, "dp_groups", topo.dp_groups(), true);
  os << "}\n";
  return os.str();
}

std::string json_quote(std::string_view s) {
  std::string out = "\"";
  for (char ch : s) {
    switch (ch) {
      case '"':
        out += "\\\"";
        break;
      case '\\':
        out += "\\\\";
        break;
      case '\b':
        out += "\\b";
        break;
      case '\f':
        out += "\\f";
        break;
      case '\n':
        out += "\\n";
        break;
      case '\r':
        out += "\\r";
        break;
      case '\t':
        out += "\\t";
        break;
      default:
        if (static_cast<unsigned char>(ch) < 0x20) {
          char buf[8];
          std::snprintf(buf, sizeof buf, "\\u%04x", static_cast<unsigned>(static_cast<unsigned char>(ch)));
          out += buf;
        } else {
          out += ch;
        }
    }
  }
  out += "\"";
  return out;
}

}  // namespace megazero::parallel_state
