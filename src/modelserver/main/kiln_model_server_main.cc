// kiln-model-server: see src/modelserver/README.md.
#include <cstdio>
#include <cstring>

int main(int argc, char** argv) {
  if (argc != 2 || std::strcmp(argv[1], "serve") != 0) {
    std::fprintf(stderr, "usage: kiln-model-server serve   (see src/modelserver/README.md)\n");
    return 2;
  }
  std::fprintf(stderr, "kiln-model-server: the front end is not built yet\n");
  return 1;
}
