# SHARDSCOPE_PYTHON: the `shardscope` Python module (python/), built with pybind11 against
# Python 3's headers. AUTO: built when both are found (Debian: pybind11-dev, python3-dev).
# ON: required (a configure-time error when missing). OFF: never. Decides
# SHARDSCOPE_PYTHON_ENABLED; python/CMakeLists.txt then makes the libraries the module links
# position-independent (a static library linked into a shared object must be).
#
# The interpreter is Debian's /usr/bin/python3 unless Python_EXECUTABLE says otherwise: the
# module is built for one interpreter's ABI, and the notebooks' kernel runs that one.
#
# The sanitizer and fuzz builds cannot load an instrumented extension into an uninstrumented
# interpreter: AUTO turns the module off there, ON is an error.
set(SHARDSCOPE_PYTHON AUTO CACHE STRING "Build the Python module (AUTO, ON, OFF)")
set_property(CACHE SHARDSCOPE_PYTHON PROPERTY STRINGS AUTO ON OFF)
if(NOT SHARDSCOPE_PYTHON MATCHES "^(AUTO|ON|OFF)$")
  message(FATAL_ERROR "SHARDSCOPE_PYTHON must be AUTO, ON or OFF, got '${SHARDSCOPE_PYTHON}'")
endif()

set(SHARDSCOPE_PYTHON_ENABLED OFF)
if(NOT SHARDSCOPE_PYTHON STREQUAL "OFF")
  if(SHARDSCOPE_SANITIZE OR SHARDSCOPE_FUZZ)
    if(SHARDSCOPE_PYTHON STREQUAL "ON")
      message(FATAL_ERROR "SHARDSCOPE_PYTHON=ON cannot be combined with SHARDSCOPE_SANITIZE or SHARDSCOPE_FUZZ: "
                          "an instrumented extension does not load into an uninstrumented python3. "
                          "Configure with -DSHARDSCOPE_PYTHON=OFF (or AUTO) there.")
    endif()
    message(STATUS "Python module: off (sanitizer or fuzz build)")
  else()
    if(NOT DEFINED Python_EXECUTABLE AND EXISTS /usr/bin/python3)
      set(Python_EXECUTABLE /usr/bin/python3)
    endif()
    find_package(Python 3.8 COMPONENTS Interpreter Development.Module QUIET)
    if(Python_FOUND)
      set(PYBIND11_FINDPYTHON ON)  # pybind11 uses the Python found above
      find_package(pybind11 2.6 CONFIG QUIET)
    endif()
    if(Python_FOUND AND pybind11_FOUND)
      set(SHARDSCOPE_PYTHON_ENABLED ON)
      message(STATUS "Python module: on (${Python_EXECUTABLE} ${Python_VERSION}, pybind11 ${pybind11_VERSION})")
    elseif(SHARDSCOPE_PYTHON STREQUAL "ON")
      message(FATAL_ERROR "SHARDSCOPE_PYTHON=ON but Python 3 headers (found: ${Python_FOUND}) or pybind11 "
                          "(found: ${pybind11_FOUND}) are missing: apt-get install python3-dev pybind11-dev "
                          "(scripts/setup.sh), or configure with -DSHARDSCOPE_PYTHON=OFF")
    else()
      message(STATUS "Python module: off (Python 3 headers found: ${Python_FOUND}, pybind11 found: "
                     "${pybind11_FOUND})")
    endif()
  endif()
endif()
