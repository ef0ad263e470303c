// External store URLs (redis://, etcd://): their syntax, checked where a URL is given (the
// profile, the environment, the options) and where a client connects. In the base layer because
// both the config and the store layers read URLs.
#include <optional>
#include <string>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "adaptcomm/store.h"

namespace adaptcomm {
namespace {

constexpr absl::string_view kForm =
    "scheme://[user:password@]host[:port] with scheme redis or etcd";

// Decodes %XX escapes, so that a password may hold '@', ':' or '/'. Empty on a broken escape.
std::optional<std::string> PercentDecoded(absl::string_view text) {
  std::string out;
  for (size_t i = 0; i < text.size(); ++i) {
    if (text[i] != '%') {
      out.push_back(text[i]);
      continue;
    }
    if (i + 2 >= text.size() || !absl::ascii_isxdigit(static_cast<unsigned char>(text[i + 1])) ||
        !absl::ascii_isxdigit(static_cast<unsigned char>(text[i + 2]))) {
      return std::nullopt;
    }
    out.push_back(static_cast<char>(std::stoi(std::string(text.substr(i + 1, 2)), nullptr, 16)));
    i += 2;
  }
  return out;
}

}  // namespace

absl::StatusOr<StoreUrl> ParseStoreUrl(const std::string& url_text) {
  const absl::string_view url = url_text;
  // The error quotes the URL without what may be a password: everything before '@' goes.
  const size_t at = url.rfind('@');
  const size_t sep = url.find("://");
  std::string shown(url);
  if (at != absl::string_view::npos) {
    const size_t from = sep != absl::string_view::npos && sep + 3 <= at ? sep + 3 : 0;
    shown = absl::StrCat(url.substr(0, from), "***", url.substr(at));
  }
  auto bad = [&](absl::string_view why) {
    return absl::InvalidArgumentError(
        absl::StrCat("store URL '", shown, "': ", why, " (expected ", kForm, ")"));
  };
  StoreUrl out;
  if (sep == absl::string_view::npos) return bad("no scheme");
  out.scheme = absl::AsciiStrToLower(url.substr(0, sep));
  if (out.scheme != "redis" && out.scheme != "etcd") {
    return bad(absl::StrCat("unknown scheme '", out.scheme, "'"));
  }
  absl::string_view rest = url.substr(sep + 3);
  if (const size_t slash = rest.find_first_of("/?#"); slash != absl::string_view::npos) {
    return bad(absl::StrCat("unexpected '", rest.substr(slash), "' after host:port"));
  }
  if (const size_t cred = rest.rfind('@'); cred != absl::string_view::npos) {
    const absl::string_view userinfo = rest.substr(0, cred);
    rest = rest.substr(cred + 1);
    const size_t colon = userinfo.find(':');
    if (colon == absl::string_view::npos) {
      return bad("credentials need a password: user:password@ (or :password@)");
    }
    std::optional<std::string> user = PercentDecoded(userinfo.substr(0, colon));
    std::optional<std::string> password = PercentDecoded(userinfo.substr(colon + 1));
    if (!user || !password) return bad("broken %-escape in the credentials");
    if (password->empty()) return bad("empty password");
    out.user = *std::move(user);
    out.password = *std::move(password);
  }
  absl::string_view port_text;
  if (!rest.empty() && rest.front() == '[') {  // [IPv6]:port
    const size_t close = rest.find(']');
    if (close == absl::string_view::npos) return bad("'[' without ']' around the host");
    out.host = std::string(rest.substr(1, close - 1));
    absl::string_view after = rest.substr(close + 1);
    if (!after.empty() && after.front() != ':') return bad("junk after ']'");
    if (!after.empty()) port_text = after.substr(1);
  } else {
    const size_t colon = rest.rfind(':');
    out.host = std::string(rest.substr(0, colon));
    if (colon != absl::string_view::npos) port_text = rest.substr(colon + 1);
    if (colon != absl::string_view::npos && port_text.empty()) return bad("empty port after ':'");
  }
  if (out.host.empty()) return bad("no host");
  out.port = out.scheme == "redis" ? 6379 : 2379;
  if (!port_text.empty() &&
      (!absl::SimpleAtoi(port_text, &out.port) || out.port < 1 || out.port > 65535)) {
    return bad(absl::StrCat("port '", port_text, "' is not a TCP port (1..65535)"));
  }
  return out;
}

std::string RedactedStoreUrl(const StoreUrl& url) {
  const std::string host =
      url.host.find(':') != std::string::npos ? absl::StrCat("[", url.host, "]") : url.host;
  const std::string cred = url.password.empty() ? "" : absl::StrCat(url.user, ":***@");
  return absl::StrCat(url.scheme, "://", cred, host, ":", url.port);
}

}  // namespace adaptcomm
