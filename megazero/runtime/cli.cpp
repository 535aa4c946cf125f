#include "megazero/runtime/cli.h"

#include "megazero/core/error.h"

namespace megazero {

boost::program_options::variables_map parse_command_line(int argc, char** argv,
                                                         const boost::program_options::options_description& desc,
                                                         const char* program) {
  namespace po = boost::program_options;
  po::variables_map vm;
  try {
    po::store(po::command_line_parser(argc, argv).options(desc).run(), vm);
    po::notify(vm);
  } catch (const po::error& e) {
    throw ConfigError(std::string(e.what()) + "; run " + program + " --help for the options");
  }
  return vm;
}

}  // namespace megazero
