#pragma once
// KILN_EMBED_FILE(symbol, "path"): puts the bytes of a file into the binary's read-only data at
// build time (the assembler's .incbin: no generated source, no CMake string processing, so a
// 700 KB service model costs nothing at build time) and declares `symbol_begin`/`symbol_end`
// around them (a NUL byte follows the end, outside the span). Use it once per symbol, at
// namespace scope in one .cc file; `path` is a string literal, normally a compile definition
// that CMake sets to an absolute path and lists as the object's dependency, so a change to the
// file rebuilds it. The symbols are hidden: they never clash across shared objects.
//
//   KILN_EMBED_FILE(kiln_sagemaker_model, KILN_SAGEMAKER_MODEL_PATH)
//   std::string_view Model() { return KILN_EMBEDDED(kiln_sagemaker_model); }

#include <cstddef>
#include <string_view>

#define KILN_EMBED_FILE(symbol, path)              \
  __asm__(                                         \
      ".pushsection .rodata\n"                     \
      ".balign 16\n"                               \
      ".global " #symbol                           \
      "_begin\n"                                   \
      ".hidden " #symbol                           \
      "_begin\n"                                   \
      ".type " #symbol "_begin, @object\n" #symbol \
      "_begin:\n"                                  \
      ".incbin \"" path                            \
      "\"\n"                                       \
      ".global " #symbol                           \
      "_end\n"                                     \
      ".hidden " #symbol                           \
      "_end\n"                                     \
      ".type " #symbol "_end, @object\n" #symbol   \
      "_end:\n"                                    \
      ".byte 0\n"                                  \
      ".popsection\n");                            \
  extern "C" const char symbol##_begin[];          \
  extern "C" const char symbol##_end[]

// The embedded bytes of `symbol` as a string_view (without the trailing NUL).
#define KILN_EMBEDDED(symbol) std::string_view(symbol##_begin, static_cast<std::size_t>(symbol##_end - symbol##_begin))
