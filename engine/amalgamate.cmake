# amalgamate.cmake - writes the single-file engine: OUTPUT_DIR/smtpe.c and OUTPUT_DIR/smtpe.h.
#
#   cmake -DOUTPUT_DIR=<dir> [-DSOURCE_DIR=<smtpe tree>] [-DVERSION=<x.y.z>]
#         [-DSOURCES=engine/a.c,engine/b.c,...] -P engine/amalgamate.cmake
#
# The build runs it as `cmake --build BUILD --target amalgamation`, passing the library's own
# source list; run by hand, SOURCE_DIR defaults to the tree the script is in, VERSION to the
# one project() gives in its CMakeLists.txt, and SOURCES to engine/*.c.
#
# smtpe.h is a copy of include/smtpe.h; smtpe.c is a header comment, #include "smtpe.h", the
# private headers engine/*.h the sources include (each after the headers it includes), then the
# sources in name order. Every `#include "..."` of a private header or of smtpe.h becomes a
# comment on the same line; system includes stay where they are. Each function prototype of a
# private header whose name starts with smtpe__ (at the start of a line, e.g.
# `size_t smtpe__reply_format(`) gets SMTPE__PRIVATE in front, which smtpe.c defines as
# `static` unless it is already defined: so only the public API has external linkage (a
# definition without `static` after a static declaration has internal linkage, C11 6.2.2p5). A test build that links the engine's unit tests to the
# internal functions compiles smtpe.c with -DSMTPE__PRIVATE= (CMake: SMTPE_TEST_AMALGAMATION).
#
# It stops with an error, rather than write a file that may mean something else than the
# sources, when a source includes a quoted header that is not in engine/ (nor smtpe.h), when
# private headers include each other in a cycle, or when a macro one source defines (and does
# not #undef) is used as an identifier, or defined again, in a source that comes after it.
cmake_minimum_required(VERSION 3.18)

if(NOT DEFINED OUTPUT_DIR)
  message(FATAL_ERROR "amalgamate.cmake: -DOUTPUT_DIR=... is required")
endif()
if(NOT DEFINED SOURCE_DIR)
  get_filename_component(SOURCE_DIR "${CMAKE_CURRENT_LIST_DIR}/.." ABSOLUTE)
endif()
get_filename_component(SOURCE_DIR "${SOURCE_DIR}" ABSOLUTE)
if(NOT DEFINED VERSION)
  file(READ "${SOURCE_DIR}/CMakeLists.txt" top)
  if(NOT top MATCHES "project\\(smtpe[ \t\r\n]+VERSION[ \t\r\n]+([0-9.]+)")
    message(FATAL_ERROR "amalgamate.cmake: no project(smtpe VERSION ...) in "
                        "${SOURCE_DIR}/CMakeLists.txt; give -DVERSION=...")
  endif()
  set(VERSION "${CMAKE_MATCH_1}")
endif()
set(engine_dir "${SOURCE_DIR}/engine")

# The sources, as paths relative to SOURCE_DIR, in name order.
if(DEFINED SOURCES AND NOT SOURCES STREQUAL "")
  string(REPLACE "," ";" sources "${SOURCES}")
else()
  file(GLOB sources RELATIVE "${SOURCE_DIR}" "${engine_dir}/*.c")
endif()
set(rel_sources)
foreach(s IN LISTS sources)
  if(IS_ABSOLUTE "${s}")
    file(RELATIVE_PATH s "${SOURCE_DIR}" "${s}")
  endif()
  if(NOT EXISTS "${SOURCE_DIR}/${s}")
    message(FATAL_ERROR "amalgamate.cmake: no source ${SOURCE_DIR}/${s}")
  endif()
  list(APPEND rel_sources "${s}")
endforeach()
list(SORT rel_sources)

# Reads a file into out_var with a "\n" in front (so that every line, the first one too,
# starts after a "\n" in the regular expressions below). CMake lists cannot hold C text (";"
# and "[" are list syntax), so the text is handled as one string throughout.
function(read_text path out_var)
  file(READ "${path}" text)
  string(REPLACE "\r\n" "\n" text "${text}")
  set(${out_var} "\n${text}" PARENT_SCOPE)
endfunction()

# The names of the quoted includes of text, in order.
function(quoted_includes text out_var)
  string(REGEX MATCHALL "\n[ \t]*#[ \t]*include[ \t]*\"[^\"\n]+\"" lines "${text}")
  set(names)
  foreach(line IN LISTS lines)
    string(REGEX REPLACE ".*\"([^\"]+)\"" "\\1" name "${line}")
    list(APPEND names "${name}")
  endforeach()
  set(${out_var} "${names}" PARENT_SCOPE)
endfunction()

# Private headers in dependency order: a depth-first walk from each source's includes, each
# header after those it includes.
set(ordered_headers)
set(visiting)
function(visit_header name from)
  if(name STREQUAL "smtpe.h")
    return()
  endif()
  if(NOT EXISTS "${engine_dir}/${name}")
    message(FATAL_ERROR "amalgamate.cmake: ${from} includes \"${name}\", which is neither "
                        "engine/${name} nor smtpe.h")
  endif()
  list(FIND ordered_headers "${name}" done)
  if(done GREATER -1)
    return()
  endif()
  list(FIND visiting "${name}" busy)
  if(busy GREATER -1)
    message(FATAL_ERROR "amalgamate.cmake: engine/${name} is part of an include cycle "
                        "(${visiting};${name})")
  endif()
  list(APPEND visiting "${name}")
  set(visiting "${visiting}" PARENT_SCOPE)
  read_text("${engine_dir}/${name}" text)
  quoted_includes("${text}" deps)
  foreach(dep IN LISTS deps)
    visit_header("${dep}" "engine/${name}")
  endforeach()
  list(REMOVE_ITEM visiting "${name}")
  set(visiting "${visiting}" PARENT_SCOPE)
  list(APPEND ordered_headers "${name}")
  set(ordered_headers "${ordered_headers}" PARENT_SCOPE)
endfunction()

foreach(s IN LISTS rel_sources)
  read_text("${SOURCE_DIR}/${s}" text)
  quoted_includes("${text}" deps)
  foreach(dep IN LISTS deps)
    visit_header("${dep}" "${s}")
  endforeach()
endforeach()

# The text of a file as it goes into smtpe.c: quoted includes commented out (the line kept, so
# line numbers match the file's own), and for a header, SMTPE__PRIVATE before each smtpe__
# function prototype.
function(amalgamated_text path is_header out_var)
  read_text("${path}" text)
  file(RELATIVE_PATH rel "${SOURCE_DIR}" "${path}")
  # Anything after the include on its line must be a comment that ends on it (it is dropped).
  string(REGEX MATCHALL "\n[ \t]*#[ \t]*include[ \t]*\"[^\"\n]+\"[^\n]*" lines "${text}")
  foreach(line IN LISTS lines)
    string(REGEX REPLACE "^\n[ \t]*#[ \t]*include[ \t]*\"[^\"\n]+\"" "" rest "${line}")
    if(NOT rest MATCHES "^[ \t]*(/\\*([^*]|\\*+[^*/])*\\*+/[ \t]*|//.*)?$")
      message(FATAL_ERROR "amalgamate.cmake: ${rel}: cannot take this include apart: ${line}")
    endif()
  endforeach()
  string(REGEX REPLACE "\n[ \t]*#[ \t]*include[ \t]*\"([^\"\n]+)\"[^\n]*"
         "\n/* #include \"\\1\": amalgamated */" text "${text}")
  if(is_header)
    # Lines that already start with a storage class or typedef are left alone.
    string(REGEX REPLACE "\n(static|extern|typedef|inline)([ \t])" "\n@KEEP@\\1\\2" text
           "${text}")
    string(REGEX MATCHALL "\n[A-Za-z_][A-Za-z0-9_ \t*]*[ \t*]smtpe__[A-Za-z0-9_]+[ \t]*\\("
           protos "${text}")
    list(LENGTH protos n)
    math(EXPR count "${private_count} + ${n}")
    set(private_count ${count} PARENT_SCOPE)
    string(REGEX REPLACE "\n([A-Za-z_][A-Za-z0-9_ \t*]*[ \t*]smtpe__[A-Za-z0-9_]+[ \t]*\\()"
           "\nSMTPE__PRIVATE \\1" text "${text}")
    string(REPLACE "\n@KEEP@" "\n" text "${text}")
  endif()
  string(REGEX REPLACE "^\n" "" text "${text}")
  set(${out_var} "${text}" PARENT_SCOPE)
endfunction()

# C text without comments, character and string literals, for the search for identifiers.
function(code_only text out_var)
  string(REGEX REPLACE "/\\*([^*]|\\*+[^*/])*\\*+/" " " text "${text}")
  string(REGEX REPLACE "//[^\n]*" " " text "${text}")
  string(REGEX REPLACE "\"([^\"\\\\\n]|\\\\.)*\"" " " text "${text}")
  string(REGEX REPLACE "'([^'\\\\\n]|\\\\.)*'" " " text "${text}")
  set(${out_var} "${text}" PARENT_SCOPE)
endfunction()

# Macros that one source leaves defined must mean nothing to the sources after it.
set(live_macros)   # NAME
set(live_origin)   # the source that defined it, in step with live_macros
foreach(s IN LISTS rel_sources)
  read_text("${SOURCE_DIR}/${s}" text)
  code_only("${text}" code)
  if(live_macros)
    string(REGEX MATCHALL "[A-Za-z_][A-Za-z0-9_]*" idents "${code}")
    list(REMOVE_DUPLICATES idents)
    set(i 0)
    foreach(m IN LISTS live_macros)
      list(FIND idents "${m}" used)
      if(used GREATER -1)
        list(GET live_origin ${i} origin)
        message(FATAL_ERROR "amalgamate.cmake: the macro ${m} that ${origin} defines is still "
                            "defined in ${s}, which comes after it in smtpe.c and uses the name "
                            "${m}: rename one of them, or #undef ${m} at the end of ${origin}")
      endif()
      math(EXPR i "${i} + 1")
    endforeach()
  endif()
  string(REGEX MATCHALL "\n[ \t]*#[ \t]*(define|undef)[ \t]+[A-Za-z_][A-Za-z0-9_]*" directives
         "${code}")
  foreach(d IN LISTS directives)
    string(REGEX REPLACE ".*#[ \t]*(define|undef)[ \t]+([A-Za-z_][A-Za-z0-9_]*)$" "\\1;\\2" kv
           "${d}")
    list(GET kv 0 kind)
    list(GET kv 1 name)
    list(FIND live_macros "${name}" at)
    if(kind STREQUAL "define" AND at EQUAL -1)
      list(APPEND live_macros "${name}")
      list(APPEND live_origin "${s}")
    elseif(kind STREQUAL "undef" AND at GREATER -1)
      list(REMOVE_AT live_macros ${at})
      list(REMOVE_AT live_origin ${at})
    endif()
  endforeach()
endforeach()

# smtpe.c
set(private_count 0)
set(parts)
foreach(h IN LISTS ordered_headers)
  amalgamated_text("${engine_dir}/${h}" 1 body)
  string(APPEND parts "\n/* ==== engine/${h} ==== */\n${body}")
endforeach()
foreach(s IN LISTS rel_sources)
  amalgamated_text("${SOURCE_DIR}/${s}" 0 body)
  string(APPEND parts "\n/* ==== ${s} ==== */\n${body}")
endforeach()

list(JOIN ordered_headers " " header_names)
string(REPLACE "engine/" "" source_names "${rel_sources}")
list(JOIN source_names " " source_names)
set(c_text "/*
 * smtpe.c - smtpe ${VERSION}, an embeddable sans-I/O SMTP engine, as one C file (amalgamation).
 *
 * Generated from the smtpe source tree by engine/amalgamate.cmake (`cmake --build BUILD
 * --target amalgamation`); do not edit: change the files it was made from. It holds the private
 * headers ${header_names} and the sources
 * ${source_names} of engine/, in that order.
 *
 * Use: put smtpe.c and smtpe.h (the one public header, include/smtpe.h) in your tree and
 * compile smtpe.c as C11 (e.g. cc -std=c11 -c smtpe.c); no define, no include path, nothing but
 * libc. Your code includes \"smtpe.h\"; the API, its parameters, errors and pointer lifetimes
 * are documented there. Only the functions smtpe.h declares have external linkage, so an object
 * or a shared library built from this file defines no other name.
 */
#include \"smtpe.h\"

/* The engine's internal functions (smtpe__*) are static here. A test build that calls them
 * from the engine's unit tests defines SMTPE__PRIVATE empty. */
#ifndef SMTPE__PRIVATE
#define SMTPE__PRIVATE static
#endif
${parts}")

file(MAKE_DIRECTORY "${OUTPUT_DIR}")
file(WRITE "${OUTPUT_DIR}/smtpe.c" "${c_text}")
file(READ "${SOURCE_DIR}/include/smtpe.h" h_text)
file(WRITE "${OUTPUT_DIR}/smtpe.h" "${h_text}")
list(LENGTH ordered_headers nh)
list(LENGTH rel_sources ns)
message(STATUS "amalgamation: ${OUTPUT_DIR}/smtpe.c (${nh} headers, ${ns} sources, "
               "${private_count} internal functions made static) and smtpe.h")
