// Binding of checked mode (include/openmla/checked.h): the switch and the status, which raises the violation.
#include "bind_common.h"
#include "openmla/checked.h"

namespace openmla::py {

void bind_checked(nb::module_& m) {
  m.def("set_checked_mode", &set_checked_mode, nb::arg("enabled"),
        "Turns checked mode on or off for the process (overrides the OPENMLA_CHECK environment variable).");
  m.def("checked_mode", &checked_mode, "Whether checked mode is on.");
  m.def(
      "checked_mode_status",
      [](int device_id) {
        Status status;
        {
          nb::gil_scoped_release release;  // it synchronises the device
          status = checked_mode_status(device_id);
        }
        throw_if_error(status);
      },
      nb::arg("device_id") = -1,
      "Raises ValueError naming the first input violation checked mode found on the device (-1: the current one) "
      "since the last call, then clears it; returns None when there was none. Synchronises the device.");
}

}  // namespace openmla::py
