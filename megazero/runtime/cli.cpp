#include "megazero/runtime/cli.h"

#include "megazero/core/error.h"

namespace megazero {

boost::program_options::variables_map parse_command_line(int argc, char** argv,
                                                         const boost::program_options::options_description& desc,
                                                         const char* program) {
  namespace po = boost::program_options;
  po::variables_map vm;
  try {
    // No prefix guessing: a misspelt flag (--num-layer) is an error, not an abbreviation.
    po::store(po::command_line_parser(argc, argv)
                  .options(desc)
                  .style(po::command_line_style::default_style & ~po::command_line_style::allow_guessing)
                  .run(),
              vm);
    po::notify(vm);
  } catch (const po::error& e) {
    throw ConfigError(std::string(e.what()) + "; run " + program + " --help for the options");
  }
  return vm;
}

}  // namespace megazero
