#include "megazero/runtime/cli.h"

#include <sstream>
#include <string_view>

#include "megazero/core/error.h"

namespace megazero {

boost::program_options::variables_map parse_command_line(int argc, char** argv,
                                                         const boost::program_options::options_description& desc,
                                                         const char* program) {
  namespace po = boost::program_options;
  po::variables_map vm;
  if (!desc.find_nothrow("help", false))
    for (int i = 1; i < argc; ++i)
      if (std::string_view(argv[i]) == "--help" || std::string_view(argv[i]) == "-h") {
        std::ostringstream os;
        os << "usage: " << program << " [options]\n" << desc;
        throw HelpRequested{os.str()};
      }
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
