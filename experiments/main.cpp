#include <unistd.h>

#include <iostream>

#include "experiments/cli.hpp"
#include "experiments/impl/descriptor_output.hpp"

int main(int argc, char* argv[]) {
  writescope::impl::DescriptorOutput standard_output(STDOUT_FILENO);
  std::ostream out(&standard_output);
  std::cerr.tie(&out);  // an error shows after the output before it, as with std::cout
  return writescope::run_cli(argc, argv, out, std::cerr);
}
