// Proves the control protocol's framing: a request line of our version parses
// into id, verb and args; every malformed line is refused with the stable
// error code a script can match (and the request id when it could be read);
// replies and requests are one JSON object per line with the shared header;
// the socket directory is refused unless it is private.
#include <stdlib.h>    // mkdtemp, setenv, unsetenv
#include <sys/stat.h>  // chmod
#include <unistd.h>    // getuid, symlink

#include <string>

#include "catch_compat.hpp"
#include "loongforge/common/error.hpp"
#include "loongforge/control/protocol.hpp"

using namespace loongforge;
using namespace loongforge::control;
using lf_catch::Contains;
using nlohmann::json;

namespace {

ProtocolError refusal(const std::string& line) {
  try {
    parse_request(line);
  } catch (const ProtocolError& e) {
    return e;
  }
  FAIL("parse_request accepted " << line);
  return {};
}

}  // namespace

TEST_CASE("control: a well-formed request line parses into id, verb and args") {
  const Request r = parse_request(R"({"v":1,"id":42,"verb":"status","args":{"verbose":true}})");
  REQUIRE(r.id == 42);
  REQUIRE(r.verb == "status");
  REQUIRE(r.args == json{{"verbose", true}});
  const Request bare = parse_request(R"({"v":1,"verb":"hello"})");
  REQUIRE(bare.id == 0);
  REQUIRE(bare.args == json::object());
}

TEST_CASE("control: malformed request lines are refused with a stable code and the id when readable") {
  struct Case {
    std::string line, code, message;
    uint64_t id;
  };
  const Case cases[] = {
      {"status please", code::kBadRequest, "not a JSON object", 0},
      {"[1,2]", code::kBadRequest, "expected a JSON object, got array", 0},
      {R"({"v":1,"id":-3,"verb":"status"})", code::kBadRequest, "\"id\" must be a non-negative integer", 0},
      {R"({"id":7,"verb":"status"})", code::kBadRequest, "missing protocol version \"v\" (this server speaks 1)", 7},
      {R"({"v":"1","id":7,"verb":"status"})", code::kBadRequest, "missing protocol version", 7},
      {R"({"v":2,"id":8,"verb":"status"})", code::kVersionMismatch,
       "client speaks protocol 2, this trainer speaks 1: use the loongforge client from the same build", 8},
      {R"({"v":1,"id":9})", code::kBadRequest, "missing \"verb\"", 9},
      {R"({"v":1,"id":9,"verb":""})", code::kBadRequest, "missing \"verb\"", 9},
      {R"({"v":1,"id":9,"verb":3})", code::kBadRequest, "missing \"verb\"", 9},
      {R"({"v":1,"id":10,"verb":"status","args":[1]})", code::kBadRequest, "\"args\" must be an object", 10},
  };
  for (const auto& c : cases) {
    INFO(c.line);
    const ProtocolError e = refusal(c.line);
    REQUIRE(e.code == c.code);
    REQUIRE_THAT(e.message, Contains(c.message));
    REQUIRE(e.id == c.id);
  }
}

TEST_CASE("control: replies and requests are single JSON lines with the protocol header") {
  const std::string ok = reply_ok(5, {{"step", 12}});
  REQUIRE(ok.back() == '\n');
  REQUIRE(ok.find('\n') == ok.size() - 1);
  REQUIRE(json::parse(ok) == json{{"v", 1}, {"id", 5}, {"ok", true}, {"result", {{"step", 12}}}});
  REQUIRE(json::parse(reply_ok(6, json::array(), /*stream=*/true)).at("stream") == true);

  const json err = json::parse(reply_error(7, code::kUnknownVerb, "unknown verb 'x'"));
  REQUIRE(
      err ==
      json{{"v", 1}, {"id", 7}, {"ok", false}, {"error", {{"code", "unknown_verb"}, {"message", "unknown verb 'x'"}}}});
  // A message quoting a client's invalid UTF-8 is still a valid line.
  const std::string bad_utf8 = reply_error(8, code::kBadRequest, std::string("got \xff\xfe"));
  REQUIRE(json::parse(bad_utf8).at("error").at("message") == "got \xEF\xBF\xBD\xEF\xBF\xBD");

  const Request back = parse_request(request_line(9, "profile-step", {{"steps", 3}}));
  REQUIRE(back.id == 9);
  REQUIRE(back.verb == "profile-step");
  REQUIRE(back.args == json{{"steps", 3}});
}

TEST_CASE("control: the socket lives in XDG_RUNTIME_DIR when it exists, else in /tmp per user") {
  char name[] = "/tmp/lf-xdg-XXXXXX";
  const std::string xdg = ::mkdtemp(name);
  const std::string fallback = "/tmp/loongforge-" + std::to_string(::getuid());
  ::setenv("XDG_RUNTIME_DIR", xdg.c_str(), 1);
  REQUIRE(socket_dir() == xdg + "/loongforge");
  REQUIRE(socket_path(1234) == xdg + "/loongforge/1234.sock");
  REQUIRE(socket_dirs() == std::vector<std::string>{xdg + "/loongforge", fallback});
  ::setenv("XDG_RUNTIME_DIR", (xdg + "/absent").c_str(), 1);
  REQUIRE(socket_dir() == fallback);
  ::unsetenv("XDG_RUNTIME_DIR");
  REQUIRE(socket_dirs() == std::vector<std::string>{fallback});
  ::rmdir(xdg.c_str());
}

TEST_CASE("control: the socket directory must be a private directory of this user") {
  char name[] = "/tmp/lf-sockdir-XXXXXX";
  const std::string root = ::mkdtemp(name);
  const std::string dir = root + "/sockets";
  ensure_private_dir(dir);  // created 0700
  struct stat st {};
  REQUIRE(::stat(dir.c_str(), &st) == 0);
  REQUIRE((st.st_mode & 0777) == 0700);
  ensure_private_dir(dir);  // exists: fine

  ::chmod(dir.c_str(), 0755);
  REQUIRE_THROWS_AS(ensure_private_dir(dir), ControlError);
  REQUIRE_THROWS_WITH(ensure_private_dir(dir), Contains(dir + " has mode 0755"));
  REQUIRE_THROWS_WITH(ensure_private_dir(dir), Contains("run `chmod 700 " + dir + "`"));
  ::chmod(dir.c_str(), 0700);

  const std::string link = root + "/link";
  REQUIRE(::symlink(dir.c_str(), link.c_str()) == 0);
  REQUIRE_THROWS_WITH(ensure_private_dir(link), Contains("exists but is not a directory (a symlink or file)"));
  ::unlink(link.c_str());
  ::rmdir(dir.c_str());
  ::rmdir(root.c_str());
}
