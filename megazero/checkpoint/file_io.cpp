#include "megazero/checkpoint/file_io.h"

#include <fcntl.h>
#include <unistd.h>
#include <xxhash.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <stdexcept>
#include <vector>

#include "megazero/core/error.h"

namespace megazero::checkpoint {

namespace fs = std::filesystem;

void fsync_path(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY);
  MZ_REQUIRE(fd >= 0, "cannot open '", path, "' to flush it: ", std::strerror(errno));
  const int rc = ::fsync(fd);
  const int err = errno;
  ::close(fd);
  MZ_REQUIRE(rc == 0, "cannot flush '", path, "' to storage: ", std::strerror(err));
}

void write_file_atomically(const std::string& path, std::string_view content) {
  const std::string tmp = path + ".tmp";
  {
    const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    MZ_REQUIRE(fd >= 0, "cannot create '", tmp, "': ", std::strerror(errno));
    std::size_t done = 0;
    while (done < content.size()) {
      const ssize_t n = ::write(fd, content.data() + done, content.size() - done);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) {
        const int err = errno;
        ::close(fd);
        throw ConfigError(detail::concat("cannot write '", tmp, "': ", std::strerror(err)));
      }
      done += static_cast<std::size_t>(n);
    }
    const int rc = ::fsync(fd);
    const int err = errno;
    ::close(fd);
    MZ_REQUIRE(rc == 0, "cannot flush '", tmp, "': ", std::strerror(err));
  }
  std::error_code ec;
  fs::rename(tmp, path, ec);
  MZ_REQUIRE(!ec, "cannot rename '", tmp, "' to '", path, "': ", ec.message());
  const fs::path parent = fs::path(path).parent_path();
  fsync_path(parent.empty() ? "." : parent.string());
}

std::string read_small_file(const std::string& path, std::uint64_t max_bytes) {
  std::error_code ec;
  const auto size = fs::file_size(path, ec);
  MZ_REQUIRE(!ec, "cannot read '", path, "': ", ec.message());
  MZ_REQUIRE(size <= max_bytes, "'", path, "' is ", size, " bytes, more than the ", max_bytes,
             " this file may have; it is not a megazero file or it is corrupt");
  std::ifstream in(path, std::ios::binary);
  MZ_REQUIRE(in.good(), "cannot open '", path, "'");
  std::string s(size, '\0');
  in.read(s.data(), static_cast<std::streamsize>(size));
  MZ_REQUIRE(static_cast<std::uint64_t>(in.gcount()) == size, "short read of '", path, "'");
  return s;
}

std::uint64_t file_xxh3(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY);
  MZ_REQUIRE(fd >= 0, "cannot open '", path, "': ", std::strerror(errno));
  std::unique_ptr<XXH3_state_t, decltype(&XXH3_freeState)> st(XXH3_createState(), &XXH3_freeState);
  XXH3_64bits_reset(st.get());
  std::vector<char> buf(std::size_t{4} << 20);
  for (;;) {
    const ssize_t n = ::read(fd, buf.data(), buf.size());
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      const int err = errno;
      ::close(fd);
      throw ConfigError(detail::concat("cannot read '", path, "': ", std::strerror(err)));
    }
    if (n == 0) break;
    XXH3_64bits_update(st.get(), buf.data(), static_cast<std::size_t>(n));
  }
  ::close(fd);
  return XXH3_64bits_digest(st.get());
}

std::string hex64(std::uint64_t v) {
  char s[17];
  std::snprintf(s, sizeof s, "%016llx", static_cast<unsigned long long>(v));
  return s;
}

std::uint64_t parse_hex64(const std::string& s) {
  if (s.size() != 16 || s.find_first_not_of("0123456789abcdef") != std::string::npos)
    throw std::runtime_error("'" + s + "' is not a 16-digit hex checksum");
  return std::stoull(s, nullptr, 16);
}

std::uint64_t bytes_xxh3(const std::string& bytes) { return XXH3_64bits(bytes.data(), bytes.size()); }

}  // namespace megazero::checkpoint
