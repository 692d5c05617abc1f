# KilnExport.cmake: export a checkpoint with kiln, then compile it with IREE,
# as build steps of a CMake project.
#
#   list(APPEND CMAKE_MODULE_PATH "<kiln>/cmake")
#   include(KilnExport)
#
#   kiln_export(NAME tiny MODEL "${CMAKE_CURRENT_SOURCE_DIR}/tiny.gguf" PACKED keep)
#   kiln_compile(NAME tiny)   # target `tiny` (built by `all`): tiny/tiny.vmfb
#
# and then, with IREE's runtime:
#
#   iree-run-module --module=build/tiny/tiny.vmfb --flagfile=build/tiny/parameters.flags \
#     --function=generate --input=1x3xi32=1,2,3 --input=i32=4
#
# CMake 3.20 or newer. Tools, found when this file is included (set the cache
# variables to choose them):
#   KILN_EXECUTABLE          `kiln`: on PATH, else in this repository's
#                            target/release or target/debug (`cargo build`).
#   IREE_COMPILE_EXECUTABLE  `iree-compile`: on PATH, else in this repository's
#                            .venv/bin (`make setup`; PyPI iree-base-compiler).
#   KILN_IREE_COMPILE_FLAGS  what kiln_compile passes to iree-compile before
#                            FLAGS for TARGET host: StableHLO input, llvm-cpu
#                            for this host's CPU at O3 with data tiling and no
#                            const-expr hoisting (the flags of `kiln compile`,
#                            why in src/iree.rs), then kiln's tuning spec
#                            (kiln-host-tuning.mlir, next to this file).
#   KILN_IREE_GPU_COMPILE_FLAGS  the same for GPU targets, before the device
#                            and arch flags: StableHLO input, O3, no const-expr
#                            hoisting (no data tiling: unfinished for GPUs).
#   KILN_TARGET              kiln_compile's TARGET when it has none: host.
#
# kiln_export(NAME <name> MODEL <checkpoint>
#             [PARAMS reference|archive|inline] [PACKED fail|dequantize|keep]
#             [DTYPE f32|f16|bf16] [MAX_CONTEXT <n>] [KV_DTYPE f32|f16|bf16]
#             [EMIT mlir|mlirbc]
#             [OUTPUT_DIR <dir>])
#
#   Runs `kiln export <checkpoint> -o <dir>` at build time, again whenever the
#   checkpoint or kiln changes; the options are `kiln export`'s (`kiln export
#   --help`), and those left out take kiln's defaults. MODEL is a .gguf file
#   or a Hugging Face directory (config.json + safetensors), relative to the
#   current source directory. OUTPUT_DIR defaults to <name> in the current
#   binary directory. The directory receives the module (model.mlir, or
#   model.mlirbc with EMIT mlirbc or PARAMS inline), params.irpa when params
#   are written, manifest.json, and parameters.flags: the
#   `--parameters=SCOPE=FILE` flags, one a line, that iree-run-module needs
#   (its `--flagfile=`).
#   Defines the target <name>_export and sets, in the caller's scope and as
#   properties of that target:
#     <name>_EXPORT_DIR / KILN_EXPORT_DIR   the directory
#     <name>_MODULE     / KILN_MODULE       the module file
#     <name>_MANIFEST   / KILN_MANIFEST     manifest.json
#     <name>_FLAGFILE   / KILN_FLAGFILE     parameters.flags
#
# kiln_compile(NAME <name> [TARGET <target>] [OUTPUT <file.vmfb>] [FLAGS <flag>...])
#
#   Compiles the module of kiln_export(NAME <name>) with iree-compile for
#   TARGET, `kiln compile --target`'s choice: host, rocm:<arch> (gfx942),
#   cuda:<arch> (sm_80, sm_89) or vulkan:<target> (rdna3); the target's
#   flags (see KILN_IREE_COMPILE_FLAGS), then FLAGS, into OUTPUT, by default
#   <export dir>/<name>.vmfb (relative: to the current binary directory).
#   With OUTPUT "${<name>_EXPORT_DIR}/model.vmfb" the directory is what
#   `kiln compile` makes, so `kiln run <dir> --prompt ...` runs it.
#   Defines the target <name>, built by `all`, and sets <name>_VMFB in the
#   caller's scope and the property KILN_VMFB of the target.

include_guard(GLOBAL)

if(CMAKE_VERSION VERSION_LESS "3.20")
  message(FATAL_ERROR "KilnExport.cmake needs CMake 3.20 or newer, not ${CMAKE_VERSION}")
endif()
# This file's policies, whatever the includer's; functions keep them.
cmake_policy(PUSH)
cmake_policy(VERSION 3.20)

# Run as a script by kiln_export's build step: writes parameters.flags
# from the `parameters` of <dir>/manifest.json.
#   cmake -D KILN_EXPORT_DIR=<dir> -D KILN_FLAGFILE=<file> -P KilnExport.cmake
function(_kiln_write_flagfile dir flagfile)
  file(READ "${dir}/manifest.json" manifest)
  string(JSON count ERROR_VARIABLE error LENGTH "${manifest}" parameters)
  if(error)
    message(FATAL_ERROR "${dir}/manifest.json: no `parameters` list (${error})")
  endif()
  set(flags "")
  if(count GREATER 0)
    math(EXPR last "${count} - 1")
    foreach(i RANGE ${last})
      string(JSON scope GET "${manifest}" parameters ${i} scope)
      string(JSON file GET "${manifest}" parameters ${i} file)
      # Relative files are in the export directory.
      cmake_path(ABSOLUTE_PATH file BASE_DIRECTORY "${dir}" NORMALIZE)
      string(APPEND flags "--parameters=${scope}=${file}\n")
    endforeach()
  endif()
  file(WRITE "${flagfile}" "${flags}")
endfunction()

if(CMAKE_SCRIPT_MODE_FILE STREQUAL CMAKE_CURRENT_LIST_FILE)
  if(NOT DEFINED KILN_EXPORT_DIR OR NOT DEFINED KILN_FLAGFILE)
    message(FATAL_ERROR "usage: cmake -D KILN_EXPORT_DIR=<dir> -D KILN_FLAGFILE=<file> -P ${CMAKE_CURRENT_LIST_FILE}")
  endif()
  _kiln_write_flagfile("${KILN_EXPORT_DIR}" "${KILN_FLAGFILE}")
  cmake_policy(POP)
  return()
endif()

set(_KILN_EXPORT_MODULE_FILE "${CMAKE_CURRENT_LIST_FILE}")
cmake_path(GET CMAKE_CURRENT_LIST_DIR PARENT_PATH _kiln_repo)

# PATHS are searched after PATH: a kiln or IREE on PATH wins over this
# repository's build and venv.
find_program(KILN_EXECUTABLE
  NAMES kiln
  PATHS "${_kiln_repo}/target/release" "${_kiln_repo}/target/debug"
  DOC "kiln, which kiln_export runs")
find_program(IREE_COMPILE_EXECUTABLE
  NAMES iree-compile
  PATHS "${_kiln_repo}/.venv/bin"
  DOC "iree-compile, which kiln_compile runs")
# Keep in step with COMPILE_FLAGS in src/iree.rs (a unit test checks).
set(KILN_IREE_COMPILE_FLAGS
  "--iree-input-type=stablehlo"
  "--iree-hal-target-device=local"
  "--iree-hal-local-target-device-backends=llvm-cpu"
  "--iree-llvmcpu-target-cpu=host"
  "--iree-opt-level=O3"
  "--iree-opt-data-tiling"
  "--iree-opt-const-expr-hoisting=false"
  "--iree-opt-const-eval=false"
  CACHE STRING "iree-compile flags of kiln_compile for TARGET host, before its FLAGS (a ;-list)")
# Keep in step with GPU_COMPILE_FLAGS in src/iree.rs (a unit test checks).
set(KILN_IREE_GPU_COMPILE_FLAGS
  "--iree-input-type=stablehlo"
  "--iree-opt-level=O3"
  "--iree-opt-const-expr-hoisting=false"
  "--iree-opt-const-eval=false"
  CACHE STRING "iree-compile flags of kiln_compile for GPU targets, before the device's and FLAGS (a ;-list)")
set(KILN_TARGET "host" CACHE STRING "kiln_compile's TARGET by default: host, rocm:<arch>, cuda:<arch>, vulkan:<target>")
set(_KILN_HOST_TUNING_SPEC "${CMAKE_CURRENT_LIST_DIR}/kiln-host-tuning.mlir")
unset(_kiln_repo)

# Sets `out` to iree-compile's flags for `target` (as `kiln compile --target`;
# src/iree.rs `Target` checks archs against IREE's tables, iree-compile does
# here).
function(_kiln_target_flags fn target out)
  if(target STREQUAL "host")
    set(flags ${KILN_IREE_COMPILE_FLAGS} "--iree-codegen-tuning-spec-path=${_KILN_HOST_TUNING_SPEC}")
  elseif(target MATCHES "^(rocm|cuda|vulkan):(.+)$")
    set(arch "${CMAKE_MATCH_2}")
    if(CMAKE_MATCH_1 STREQUAL "rocm")
      set(device hip)
    else()
      set(device "${CMAKE_MATCH_1}")
    endif()
    set(flags ${KILN_IREE_GPU_COMPILE_FLAGS} "--iree-hal-target-device=${device}"
              "--iree-${CMAKE_MATCH_1}-target=${arch}")
  else()
    message(FATAL_ERROR "${fn}: TARGET is \"${target}\"; expected host, rocm:<arch> (gfx942), "
                        "cuda:<arch> (sm_80, sm_89) or vulkan:<target> (rdna3)")
  endif()
  set("${out}" "${flags}" PARENT_SCOPE)
endfunction()

# Fails unless `value` (of keyword `key`) is one of the remaining arguments.
function(_kiln_check_choice fn key value)
  if(NOT value IN_LIST ARGN)
    list(JOIN ARGN ", " choices)
    message(FATAL_ERROR "${fn}: ${key} is \"${value}\"; expected one of: ${choices}")
  endif()
endfunction()

# Fails on arguments cmake_parse_arguments did not take, and on NAME missing
# or not usable as a target name.
function(_kiln_check_common fn name unparsed missing)
  if("NAME" IN_LIST missing OR name STREQUAL "")
    message(FATAL_ERROR "${fn}: NAME <name> is required")
  endif()
  if(NOT name MATCHES "^[A-Za-z0-9_.+-]+$")
    message(FATAL_ERROR "${fn}: NAME \"${name}\" is not a valid target name")
  endif()
  if(unparsed)
    message(FATAL_ERROR "${fn}(NAME ${name}): unexpected arguments: ${unparsed}")
  endif()
endfunction()

function(kiln_export)
  set(fn "kiln_export")
  cmake_parse_arguments(PARSE_ARGV 0 arg
    ""
    "NAME;MODEL;PARAMS;PACKED;DTYPE;MAX_CONTEXT;KV_DTYPE;EMIT;OUTPUT_DIR"
    "")
  _kiln_check_common("${fn}" "${arg_NAME}" "${arg_UNPARSED_ARGUMENTS}" "${arg_KEYWORDS_MISSING_VALUES}")
  set(fn "kiln_export(NAME ${arg_NAME})")
  if(NOT arg_MODEL)
    message(FATAL_ERROR "${fn}: MODEL <checkpoint> is required (a .gguf file or an HF directory)")
  endif()
  foreach(key IN LISTS arg_KEYWORDS_MISSING_VALUES)
    message(FATAL_ERROR "${fn}: ${key} needs a value")
  endforeach()
  if(TARGET "${arg_NAME}_export")
    message(FATAL_ERROR "${fn}: the target ${arg_NAME}_export already exists (NAME used twice?)")
  endif()
  if(NOT KILN_EXECUTABLE)
    message(FATAL_ERROR "${fn}: cannot find `kiln`; build it (`cargo build` in kiln's repository) "
                        "and set KILN_EXECUTABLE to its path")
  endif()

  set(options "")
  if(DEFINED arg_PARAMS)
    _kiln_check_choice("${fn}" PARAMS "${arg_PARAMS}" reference archive inline)
    list(APPEND options --params "${arg_PARAMS}")
  else()
    set(arg_PARAMS reference)
  endif()
  if(DEFINED arg_PACKED)
    _kiln_check_choice("${fn}" PACKED "${arg_PACKED}" fail dequantize keep)
    list(APPEND options --packed "${arg_PACKED}")
  endif()
  if(DEFINED arg_DTYPE)
    _kiln_check_choice("${fn}" DTYPE "${arg_DTYPE}" f32 f16 bf16)
    list(APPEND options --dtype "${arg_DTYPE}")
  endif()
  if(DEFINED arg_MAX_CONTEXT)
    if(NOT arg_MAX_CONTEXT MATCHES "^[1-9][0-9]*$")
      message(FATAL_ERROR "${fn}: MAX_CONTEXT is \"${arg_MAX_CONTEXT}\"; expected a positive integer")
    endif()
    list(APPEND options --max-context "${arg_MAX_CONTEXT}")
  endif()
  if(DEFINED arg_KV_DTYPE)
    _kiln_check_choice("${fn}" KV_DTYPE "${arg_KV_DTYPE}" f32 f16 bf16)
    list(APPEND options --kv-dtype "${arg_KV_DTYPE}")
  endif()
  if(DEFINED arg_EMIT)
    _kiln_check_choice("${fn}" EMIT "${arg_EMIT}" mlir mlirbc)
    list(APPEND options --emit "${arg_EMIT}")
    set(emit "${arg_EMIT}")
  elseif(arg_PARAMS STREQUAL "inline")
    set(emit mlirbc)
  else()
    set(emit mlir)
  endif()

  set(model "${arg_MODEL}")
  cmake_path(ABSOLUTE_PATH model BASE_DIRECTORY "${CMAKE_CURRENT_SOURCE_DIR}" NORMALIZE)
  if(IS_DIRECTORY "${model}")
    # An HF checkpoint: what kiln reads from it.
    file(GLOB model_files CONFIGURE_DEPENDS
      "${model}/config.json" "${model}/*.safetensors" "${model}/*.safetensors.index.json")
    if(NOT model_files)
      message(FATAL_ERROR "${fn}: MODEL ${model} is a directory without config.json or safetensors")
    endif()
  else()
    # A file, possibly made by an earlier build step.
    set(model_files "${model}")
  endif()

  if(DEFINED arg_OUTPUT_DIR)
    set(dir "${arg_OUTPUT_DIR}")
  else()
    set(dir "${arg_NAME}")
  endif()
  cmake_path(ABSOLUTE_PATH dir BASE_DIRECTORY "${CMAKE_CURRENT_BINARY_DIR}" NORMALIZE)
  string(REGEX REPLACE "(.)/+$" "\\1" dir "${dir}")

  set(module "${dir}/model.${emit}")
  set(manifest "${dir}/manifest.json")
  set(flagfile "${dir}/parameters.flags")
  set(outputs "${manifest}" "${module}" "${flagfile}")
  set(byproducts "")
  if(arg_PARAMS STREQUAL "archive")
    list(APPEND outputs "${dir}/params.irpa")
  elseif(arg_PARAMS STREQUAL "reference")
    # Written only when params are derived (PACKED dequantize).
    list(APPEND byproducts "${dir}/params.irpa")
  endif()

  # A new kiln exports again (a tool given as a bare name is not a file).
  set(tool "")
  if(IS_ABSOLUTE "${KILN_EXECUTABLE}")
    set(tool "${KILN_EXECUTABLE}")
  endif()
  add_custom_command(
    OUTPUT ${outputs}
    BYPRODUCTS ${byproducts}
    COMMAND "${KILN_EXECUTABLE}" export "${model}" -o "${dir}" ${options}
    COMMAND "${CMAKE_COMMAND}" -D "KILN_EXPORT_DIR=${dir}" -D "KILN_FLAGFILE=${flagfile}"
            -P "${_KILN_EXPORT_MODULE_FILE}"
    DEPENDS ${model_files} ${tool} "${_KILN_EXPORT_MODULE_FILE}"
    COMMENT "Exporting ${arg_NAME} with kiln: ${model}"
    VERBATIM)
  add_custom_target("${arg_NAME}_export" DEPENDS ${outputs})
  set_target_properties("${arg_NAME}_export" PROPERTIES
    KILN_EXPORT_DIR "${dir}"
    KILN_MODULE "${module}"
    KILN_MANIFEST "${manifest}"
    KILN_FLAGFILE "${flagfile}"
    KILN_PARAMS "${arg_PARAMS}")

  set("${arg_NAME}_EXPORT_DIR" "${dir}" PARENT_SCOPE)
  set("${arg_NAME}_MODULE" "${module}" PARENT_SCOPE)
  set("${arg_NAME}_MANIFEST" "${manifest}" PARENT_SCOPE)
  set("${arg_NAME}_FLAGFILE" "${flagfile}" PARENT_SCOPE)
endfunction()

function(kiln_compile)
  set(fn "kiln_compile")
  cmake_parse_arguments(PARSE_ARGV 0 arg "" "NAME;TARGET;OUTPUT" "FLAGS")
  _kiln_check_common("${fn}" "${arg_NAME}" "${arg_UNPARSED_ARGUMENTS}" "${arg_KEYWORDS_MISSING_VALUES}")
  set(fn "kiln_compile(NAME ${arg_NAME})")
  foreach(key OUTPUT TARGET)
    if(key IN_LIST arg_KEYWORDS_MISSING_VALUES)
      message(FATAL_ERROR "${fn}: ${key} needs a value")
    endif()
  endforeach()
  if(NOT DEFINED arg_TARGET)
    set(arg_TARGET "${KILN_TARGET}")
  endif()
  _kiln_target_flags("${fn}" "${arg_TARGET}" target_flags)
  if(NOT TARGET "${arg_NAME}_export")
    message(FATAL_ERROR "${fn}: no kiln_export(NAME ${arg_NAME} ...) before it")
  endif()
  if(TARGET "${arg_NAME}")
    message(FATAL_ERROR "${fn}: the target ${arg_NAME} already exists")
  endif()
  if(NOT IREE_COMPILE_EXECUTABLE)
    message(FATAL_ERROR "${fn}: cannot find `iree-compile`; install it (`pip install iree-base-compiler`, "
                        "or `make setup` in kiln's repository) and set IREE_COMPILE_EXECUTABLE to its path")
  endif()

  get_target_property(dir "${arg_NAME}_export" KILN_EXPORT_DIR)
  get_target_property(module "${arg_NAME}_export" KILN_MODULE)
  get_target_property(params "${arg_NAME}_export" KILN_PARAMS)
  # As manifest.json's compile_flags: inline weights are constants, which
  # iree-compile would otherwise evaluate the in-graph dequantization of.
  set(mode_flags "")
  if(params STREQUAL "inline")
    set(mode_flags --iree-opt-const-eval=false)
  endif()
  if(DEFINED arg_OUTPUT)
    set(vmfb "${arg_OUTPUT}")
    cmake_path(ABSOLUTE_PATH vmfb BASE_DIRECTORY "${CMAKE_CURRENT_BINARY_DIR}" NORMALIZE)
  else()
    set(vmfb "${dir}/${arg_NAME}.vmfb")
  endif()
  cmake_path(GET vmfb PARENT_PATH vmfb_dir)
  set(tool "")
  if(IS_ABSOLUTE "${IREE_COMPILE_EXECUTABLE}")
    set(tool "${IREE_COMPILE_EXECUTABLE}")
  endif()

  add_custom_command(
    OUTPUT "${vmfb}"
    COMMAND "${CMAKE_COMMAND}" -E make_directory "${vmfb_dir}"
    COMMAND "${IREE_COMPILE_EXECUTABLE}" ${target_flags} ${mode_flags} ${arg_FLAGS} "${module}" -o "${vmfb}"
    DEPENDS "${module}" "${arg_NAME}_export" ${tool} "${_KILN_HOST_TUNING_SPEC}"
    COMMENT "Compiling ${arg_NAME} with iree-compile for ${arg_TARGET}: ${vmfb}"
    VERBATIM)
  add_custom_target("${arg_NAME}" ALL DEPENDS "${vmfb}")
  # The export runs in its own target first, never twice in parallel.
  add_dependencies("${arg_NAME}" "${arg_NAME}_export")
  set_target_properties("${arg_NAME}" PROPERTIES KILN_VMFB "${vmfb}" KILN_TARGET "${arg_TARGET}")
  set("${arg_NAME}_VMFB" "${vmfb}" PARENT_SCOPE)
endfunction()

cmake_policy(POP)
