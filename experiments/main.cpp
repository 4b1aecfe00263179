#include <iostream>

#include "experiments/cli.hpp"

int main(int argc, char* argv[]) { return writescope::run_cli(argc, argv, std::cout, std::cerr); }
