#include <unistd.h>

#include <iostream>

#include "experiments/cli.hpp"
#include "experiments/impl/descriptor_output.hpp"

int main(int argc, char* argv[]) {
  writescope::impl::DescriptorOutput standard_output(STDOUT_FILENO);
  std::ostream out(&standard_output);
  return writescope::run_cli(argc, argv, out, std::cerr);
}
