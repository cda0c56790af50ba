# Checks cmake/embed_console.cmake on small dist folders it writes itself (ctest
# console_embed_generator): a manifest's files and variants become table rows, a missing dist
# gives the "not built" table, and bad manifests fail the build with a message that says what to do.
#   cmake -DWORK=<scratch dir> -DGENERATOR=<cmake/embed_console.cmake> -P cmake/embed_console_test.cmake
file(REMOVE_RECURSE "${WORK}")
file(MAKE_DIRECTORY "${WORK}/dist/assets")
file(WRITE "${WORK}/dist/index.html" "<!doctype html>")
file(WRITE "${WORK}/dist/index.html.gz" "gz")
file(WRITE "${WORK}/dist/index.html.br" "br")
file(WRITE "${WORK}/dist/assets/app-AB12.js" "x()")
file(WRITE "${WORK}/dist/assets/app-AB12.js.gz" "gz")
file(WRITE "${WORK}/dist/stray.txt" "not listed")
file(SHA256 "${WORK}/dist/index.html" index_hash)

function(generate dist out expect_ok)
  execute_process(COMMAND ${CMAKE_COMMAND} -DDIST=${dist} -DOUT=${out} -P ${GENERATOR}
                  RESULT_VARIABLE rc OUTPUT_VARIABLE stdout ERROR_VARIABLE stderr)
  # CMake wraps messages: compare with runs of blanks and newlines as one space.
  string(REGEX REPLACE "[ \n]+" " " flat "${stdout}${stderr}")
  set(output "${flat}" PARENT_SCOPE)
  if(expect_ok AND NOT rc EQUAL 0)
    message(FATAL_ERROR "the generator failed on ${dist}: ${stdout}${stderr}")
  elseif(NOT expect_ok AND rc EQUAL 0)
    message(FATAL_ERROR "the generator accepted ${dist}/manifest.json")
  endif()
endfunction()

function(expect_in text needle)
  string(FIND "${text}" "${needle}" at)
  if(at EQUAL -1)
    message(FATAL_ERROR "expected `${needle}` in:\n${text}")
  endif()
endfunction()

# A good manifest: every listed file and variant, immutable flags, types (given or guessed).
file(WRITE "${WORK}/dist/manifest.json" "{\"version\": 1, \"files\": [
  {\"path\": \"index.html\", \"type\": \"text/html; charset=utf-8\", \"hash\": \"${index_hash}\", \"gzip\": true, \"br\": true},
  {\"path\": \"assets/app-AB12.js\", \"gzip\": true, \"immutable\": true}]}")
generate("${WORK}/dist" "${WORK}/out.cc" TRUE)
file(READ "${WORK}/out.cc" cc)
expect_in("${cc}" "{\"index.html\", \"text/html; charset=utf-8\", \"${index_hash}\", false, KILN_EMBEDDED(kiln_console_0), KILN_EMBEDDED(kiln_console_0_gz), KILN_EMBEDDED(kiln_console_0_br)}")
expect_in("${cc}" "{\"assets/app-AB12.js\", \"text/javascript; charset=utf-8\", ")
expect_in("${cc}" ", true, KILN_EMBEDDED(kiln_console_1), KILN_EMBEDDED(kiln_console_1_gz), {}}")
expect_in("${cc}" "KILN_EMBED_FILE(kiln_console_1, \"${WORK}/out.cc.files/1\");")
expect_in("${cc}" "kAssets{true, kFiles}")
string(FIND "${cc}" "stray" stray)
if(NOT stray EQUAL -1)
  message(FATAL_ERROR "a file the manifest does not list was embedded")
endif()
if(NOT EXISTS "${WORK}/out.cc.files/0.br")
  message(FATAL_ERROR "the variants were not copied beside the generated file")
endif()
# Unchanged input: the file is not rewritten (no recompile).
file(TIMESTAMP "${WORK}/out.cc" before "%s")
execute_process(COMMAND ${CMAKE_COMMAND} -E sleep 1.1)
generate("${WORK}/dist" "${WORK}/out.cc" TRUE)
file(TIMESTAMP "${WORK}/out.cc" after "%s")
if(NOT before STREQUAL after)
  message(FATAL_ERROR "the generated file was rewritten although nothing changed")
endif()

# No dist: the "not built" table.
generate("${WORK}/missing" "${WORK}/none.cc" TRUE)
file(READ "${WORK}/none.cc" cc)
expect_in("${cc}" "kAssets{false, {}}")

# Bad manifests: each refused with what to do.
foreach(case
    "{\"files\": [{\"path\": \"../etc/passwd\"}]}|must be relative"
    "{\"files\": [{\"path\": \"index.html\"}, {\"path\": \"gone.js\"}]}|rebuild the ui"
    "{\"files\": [{\"path\": \"assets/app-AB12.js\"}]}|index.html is not listed"
    "{\"files\": [{\"path\": \"assets/app-AB12.js\", \"br\": true}, {\"path\": \"index.html\"}]}|br but assets/app-AB12.js.br is missing"
    "[1, 2]|expected {\"files\"")
  string(FIND "${case}" "|" bar)
  string(SUBSTRING "${case}" 0 ${bar} manifest)
  math(EXPR from "${bar} + 1")
  string(SUBSTRING "${case}" ${from} -1 message)
  file(WRITE "${WORK}/dist/manifest.json" "${manifest}")
  generate("${WORK}/dist" "${WORK}/bad.cc" FALSE)
  expect_in("${output}" "${message}")
endforeach()
file(REMOVE_RECURSE "${WORK}")
