#include "megazero/comm/virtual_communicator.h"

#include "megazero/core/error.h"

namespace megazero {

std::unique_ptr<Communicator> VirtualCommunicator::do_split(int, int, const std::string& name) {
  // Splitting needs every rank's color; a virtual rank knows only its own.
  // The planner builds its groups from the topology instead.
  throw InternalError("virtual communicator '" + this->name() + "' cannot split into '" + name +
                      "': build the group from the topology");
}

}  // namespace megazero
