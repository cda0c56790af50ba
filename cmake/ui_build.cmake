# Rebuilds the web console (ui/, `npm run build`) during the CMake build, so that an edit under
# ui/src reaches the binary through a plain `cmake --build` (src/api/CMakeLists.txt runs this when
# ui/src, ui/build.mjs or ui/package*.json change). Best effort by design: without npm or
# ui/node_modules it does nothing (scripts/build.sh installs the modules and builds the ui first,
# failing loudly), and a failing ui build only warns and keeps the last ui/dist, so a ui edit in
# progress never blocks building the server.
#   cmake -DUI=<ui dir> -P cmake/ui_build.cmake
if(NOT UI)
  message(FATAL_ERROR "ui_build.cmake: pass -DUI=<ui dir>")
endif()
find_program(KILN_NPM npm)
if(NOT KILN_NPM OR NOT EXISTS "${UI}/node_modules" OR NOT EXISTS "${UI}/package.json")
  return()
endif()
execute_process(COMMAND "${KILN_NPM}" run build --silent WORKING_DIRECTORY "${UI}" RESULT_VARIABLE rc)
if(NOT rc EQUAL 0)
  message(WARNING "The console's ui build failed (npm run build: ${rc}); the binary keeps the last ui/dist. "
                  "Fix ui/ and build again (cd ui && npm run build shows the error).")
endif()
