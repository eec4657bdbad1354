// The tapestry command line. For now it reports its version and usage; train, translate, bleu
// and bench arrive with the issues that build them.
#include <cstdio>
#include <cstring>
#include <string>

#include "tapestry.h"

namespace {
void usage(FILE* out) {
  std::fprintf(out,
               "usage: tapestry [--help] [--version]\n"
               "\n"
               "tapestry %s: a C++ autograd engine and Transformer model zoo.\n"
               "  --help       show this message\n"
               "  --version    print the version\n",
               TAPESTRY_VERSION);
}
}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    usage(stdout);
    return 0;
  }
  std::string arg = argv[1];
  if (arg == "--help" || arg == "-h") {
    usage(stdout);
    return 0;
  }
  if (arg == "--version") {
    std::printf("tapestry %s\n", TAPESTRY_VERSION);
    return 0;
  }
  std::fprintf(stderr, "tapestry: unknown argument '%s' (see tapestry --help)\n", arg.c_str());
  return 2;
}
