#include "core/io/npy.h"

#include <cstring>
#include <fstream>
#include <sstream>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"

namespace entrokv {
namespace {

constexpr char kMagic[] = "\x93NUMPY";
constexpr size_t kMagicBytes = 6;

int ElementBytes(NpyType type) { return type == NpyType::kFloat32 ? 4 : 2; }

absl::string_view Descr(NpyType type) {
  switch (type) {
    case NpyType::kFloat32:
      return "<f4";
    case NpyType::kFloat16:
      return "<f2";
    case NpyType::kUInt16:
      return "<u2";
  }
  return "";
}

// The value text after `'key':` in the header dict, up to the next top-level comma.
absl::StatusOr<std::string> HeaderValue(absl::string_view header, absl::string_view key) {
  const std::string quoted = absl::StrCat("'", key, "'");
  const size_t at = header.find(quoted);
  if (at == absl::string_view::npos) {
    return absl::InvalidArgumentError(absl::StrCat("npy: header has no '", key, "'"));
  }
  size_t begin = header.find(':', at + quoted.size());
  if (begin == absl::string_view::npos) {
    return absl::InvalidArgumentError(absl::StrCat("npy: header entry '", key, "' is malformed"));
  }
  ++begin;
  int depth = 0;
  size_t end = begin;
  for (; end < header.size(); ++end) {
    const char c = header[end];
    if (c == '(') ++depth;
    if (c == ')') --depth;
    if ((c == ',' && depth == 0) || c == '}') break;
  }
  return std::string(absl::StripAsciiWhitespace(header.substr(begin, end - begin)));
}

}  // namespace

int64_t NpyArray::element_count() const {
  int64_t count = 1;
  for (const int64_t dim : shape) count *= dim;
  return count;
}

absl::StatusOr<NpyArray> ParseNpy(const std::string& contents) {
  if (contents.size() < kMagicBytes + 4 || std::memcmp(contents.data(), kMagic, kMagicBytes) != 0) {
    return absl::InvalidArgumentError("npy: not a .npy file (bad magic)");
  }
  const auto major = static_cast<uint8_t>(contents[6]);
  size_t header_bytes;
  size_t header_start;
  if (major == 1) {
    header_bytes = static_cast<uint8_t>(contents[8]) | (static_cast<uint8_t>(contents[9]) << 8);
    header_start = 10;
  } else if (major == 2 || major == 3) {
    if (contents.size() < 12) return absl::InvalidArgumentError("npy: truncated header");
    header_bytes = 0;
    for (int i = 3; i >= 0; --i) {
      header_bytes = (header_bytes << 8) | static_cast<uint8_t>(contents[8 + i]);
    }
    header_start = 12;
  } else {
    return absl::InvalidArgumentError(absl::StrCat("npy: unsupported version ", major));
  }
  if (contents.size() < header_start + header_bytes) {
    return absl::InvalidArgumentError("npy: truncated header");
  }
  const absl::string_view header(contents.data() + header_start, header_bytes);

  NpyArray array;
  auto descr = HeaderValue(header, "descr");
  if (!descr.ok()) return descr.status();
  if (*descr == "'<f4'") {
    array.type = NpyType::kFloat32;
  } else if (*descr == "'<f2'") {
    array.type = NpyType::kFloat16;
  } else if (*descr == "'<u2'") {
    array.type = NpyType::kUInt16;
  } else {
    return absl::InvalidArgumentError(
        absl::StrCat("npy: dtype ", *descr,
                     " is not supported; use little-endian float32 ('<f4'), "
                     "float16 ('<f2') or bfloat16 stored as uint16 ('<u2')"));
  }
  auto fortran = HeaderValue(header, "fortran_order");
  if (!fortran.ok()) return fortran.status();
  if (*fortran != "False") {
    return absl::InvalidArgumentError("npy: Fortran-ordered arrays are not supported");
  }
  auto shape_text = HeaderValue(header, "shape");
  if (!shape_text.ok()) return shape_text.status();
  absl::string_view inner = *shape_text;
  if (!absl::ConsumePrefix(&inner, "(") || !absl::ConsumeSuffix(&inner, ")")) {
    return absl::InvalidArgumentError(absl::StrCat("npy: malformed shape ", *shape_text));
  }
  for (absl::string_view part : absl::StrSplit(inner, ',', absl::SkipWhitespace())) {
    int64_t dim;
    if (!absl::SimpleAtoi(absl::StripAsciiWhitespace(part), &dim) || dim < 0) {
      return absl::InvalidArgumentError(absl::StrCat("npy: malformed shape ", *shape_text));
    }
    array.shape.push_back(dim);
  }
  const size_t data_start = header_start + header_bytes;
  // The element count, checked before it can overflow: a shape like (4, 2**62) would wrap to 0
  // elements and pass as an empty array that its readers then index far out of bounds.
  uint64_t expected = static_cast<uint64_t>(ElementBytes(array.type));
  for (const int64_t dim : array.shape) {
    if (__builtin_mul_overflow(expected, static_cast<uint64_t>(dim), &expected)) {
      return absl::InvalidArgumentError(
          absl::StrCat("npy: shape ", *shape_text, " holds more elements than can be addressed"));
    }
  }
  if (contents.size() - data_start != expected) {
    return absl::InvalidArgumentError(absl::StrCat("npy: data is ", contents.size() - data_start,
                                                   " bytes, the shape needs ", expected));
  }
  array.bytes.assign(contents.begin() + static_cast<int64_t>(data_start), contents.end());
  return array;
}

absl::StatusOr<NpyArray> ReadNpy(const std::string& path) {
  std::ifstream file(path, std::ios::binary);
  if (!file) return absl::NotFoundError(absl::StrCat("npy: cannot open ", path));
  std::ostringstream contents;
  contents << file.rdbuf();
  auto array = ParseNpy(contents.str());
  if (!array.ok()) {
    return absl::Status(array.status().code(), absl::StrCat(path, ": ", array.status().message()));
  }
  return array;
}

absl::Status WriteNpy(const std::string& path, const NpyArray& array) {
  std::string shape = absl::StrJoin(array.shape, ", ");
  if (array.shape.size() == 1) shape += ",";
  std::string header = absl::StrCat("{'descr': '", Descr(array.type),
                                    "', 'fortran_order': False, 'shape': (", shape, "), }");
  // Pad with spaces so that the data starts on a 64-byte boundary; the header ends in '\n'.
  const size_t unpadded = kMagicBytes + 4 + header.size() + 1;
  header.append((64 - unpadded % 64) % 64, ' ');
  header.push_back('\n');
  std::ofstream file(path, std::ios::binary | std::ios::trunc);
  if (!file) return absl::PermissionDeniedError(absl::StrCat("npy: cannot write ", path));
  const uint16_t length = static_cast<uint16_t>(header.size());
  file.write(kMagic, kMagicBytes);
  file.put('\x01');
  file.put('\x00');
  file.put(static_cast<char>(length & 0xff));
  file.put(static_cast<char>(length >> 8));
  file << header;
  file.write(reinterpret_cast<const char*>(array.bytes.data()),
             static_cast<std::streamsize>(array.bytes.size()));
  if (!file) return absl::DataLossError(absl::StrCat("npy: short write to ", path));
  return absl::OkStatus();
}

}  // namespace entrokv
