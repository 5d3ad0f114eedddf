// test/catch_compat.hpp — one include for Catch2 v2 (Debian 12) and v3
// (Ubuntu 24.04). Tests use only macros common to both.
#pragma once

#if __has_include(<catch2/catch_test_macros.hpp>)
#include <catch2/catch_approx.hpp>                  // Catch::Approx
#include <catch2/catch_test_macros.hpp>             // TEST_CASE, REQUIRE
#include <catch2/matchers/catch_matchers_string.hpp>  // ContainsSubstring
namespace lf_catch {
inline auto Contains(const std::string& s) { return Catch::Matchers::ContainsSubstring(s); }
}  // namespace lf_catch
#else
#include <catch2/catch.hpp>
namespace lf_catch {
inline auto Contains(const std::string& s) { return Catch::Matchers::Contains(s); }
}  // namespace lf_catch
#endif
