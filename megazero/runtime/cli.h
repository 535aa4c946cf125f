// Command-line parsing shared by every executable: Boost.Program_options with
// one rule — a misspelt, unknown or malformed flag is a ConfigError that names
// it and points at --help, never something silently ignored. --help works in
// every tool: one that declares no "help" option gets the option list.
#pragma once

#include <boost/program_options.hpp>
#include <string>

namespace megazero {

// Thrown by parse_command_line for --help / -h when the tool declares no help
// option of its own: run_main prints `text` on rank 0 and exits 0.
struct HelpRequested {
  std::string text;
};

boost::program_options::variables_map parse_command_line(int argc, char** argv,
                                                         const boost::program_options::options_description& desc,
                                                         const char* program);

}  // namespace megazero
