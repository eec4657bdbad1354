# OpInfo-style differential testing against PyTorch (tests/opinfo.h). Included from the main
# CMakeLists.txt after the tapestry_tests target: the table's samples run inside the doctest
# suite (tests/test_opinfo.cpp), and opinfo_dump + tools/reference/opinfo_ref.py compare every
# output, gradient and error with PyTorch (needs /usr/bin/python3 with torch:
# tools/setup-reference.sh installs it).
add_executable(opinfo_dump tests/opinfo_dump.cpp tests/opinfo.cpp)
target_link_libraries(opinfo_dump PRIVATE tapestry nlohmann_json::nlohmann_json)

target_sources(tapestry_tests PRIVATE tests/test_opinfo.cpp tests/opinfo.cpp)

add_test(NAME opinfo_parity
         COMMAND ${CMAKE_CURRENT_SOURCE_DIR}/tests/opinfo.sh $<TARGET_FILE:opinfo_dump> --seed 1 --random-programs 200)
# The long run: 20000 random programs. Labelled "long" and left out of the default run
# (tools/test.sh runs `ctest -LE long`); run it with `ctest -L long`.
add_test(NAME opinfo_parity_long
         COMMAND ${CMAKE_CURRENT_SOURCE_DIR}/tests/opinfo.sh $<TARGET_FILE:opinfo_dump> --seed 1 --random-programs 20000)
set_tests_properties(opinfo_parity_long PROPERTIES LABELS long TIMEOUT 3600)
