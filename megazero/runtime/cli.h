// Command-line parsing shared by every executable: Boost.Program_options with
// one rule — a misspelt, unknown or malformed flag is a ConfigError that names
// it and points at --help, never something silently ignored.
#pragma once

#include <boost/program_options.hpp>

namespace megazero {

boost::program_options::variables_map parse_command_line(int argc, char** argv,
                                                         const boost::program_options::options_description& desc,
                                                         const char* program);

}  // namespace megazero
