#include "sim/json.h"

#include <cstdlib>

#include "absl/strings/str_cat.h"

namespace entrokv::sim {
namespace {

constexpr int kMaxDepth = 64;

class Parser {
 public:
  explicit Parser(absl::string_view text) : text_(text) {}

  absl::StatusOr<JsonValue> ParseDocument() {
    JsonValue value;
    if (absl::Status status = ParseValue(0, &value); !status.ok()) return status;
    SkipSpace();
    if (pos_ != text_.size()) return Error("trailing characters");
    return value;
  }

 private:
  absl::Status Error(absl::string_view what) const {
    return absl::InvalidArgumentError(absl::StrCat("json: ", what, " at byte ", pos_));
  }
  void SkipSpace() {
    while (pos_ < text_.size() && (text_[pos_] == ' ' || text_[pos_] == '\n' ||
                                   text_[pos_] == '\r' || text_[pos_] == '\t')) {
      ++pos_;
    }
  }
  bool Consume(absl::string_view word) {
    if (text_.substr(pos_, word.size()) != word) return false;
    pos_ += word.size();
    return true;
  }

  absl::Status ParseValue(int depth, JsonValue* value) {
    if (depth > kMaxDepth) return Error("nesting too deep");
    SkipSpace();
    if (pos_ >= text_.size()) return Error("unexpected end");
    const char c = text_[pos_];
    if (c == '{') return ParseObject(depth, value);
    if (c == '[') return ParseArray(depth, value);
    if (c == '"') {
      value->type = JsonValue::Type::kString;
      return ParseString(&value->text);
    }
    if (Consume("true")) {
      value->type = JsonValue::Type::kBool;
      value->boolean = true;
      return absl::OkStatus();
    }
    if (Consume("false")) {
      value->type = JsonValue::Type::kBool;
      return absl::OkStatus();
    }
    if (Consume("null")) return absl::OkStatus();
    return ParseNumber(value);
  }

  absl::Status ParseNumber(JsonValue* value) {
    const size_t start = pos_;
    while (pos_ < text_.size() &&
           absl::string_view("+-0123456789.eE").find(text_[pos_]) != absl::string_view::npos) {
      ++pos_;
    }
    if (start == pos_) return Error("expected a value");
    const std::string number(text_.substr(start, pos_ - start));
    char* end = nullptr;
    value->number = std::strtod(number.c_str(), &end);
    if (end != number.c_str() + number.size()) return Error("malformed number");
    value->type = JsonValue::Type::kNumber;
    return absl::OkStatus();
  }

  absl::Status ParseString(std::string* out) {
    ++pos_;  // opening quote
    while (pos_ < text_.size() && text_[pos_] != '"') {
      char c = text_[pos_++];
      if (c == '\\') {
        if (pos_ >= text_.size()) return Error("unterminated escape");
        const char e = text_[pos_++];
        switch (e) {
          case 'n':
            c = '\n';
            break;
          case 't':
            c = '\t';
            break;
          case 'r':
            c = '\r';
            break;
          case 'b':
            c = '\b';
            break;
          case 'f':
            c = '\f';
            break;
          case 'u': {
            // Only the ASCII range is needed for metadata; others become '?'.
            if (pos_ + 4 > text_.size()) return Error("short \\u escape");
            const long code = std::strtol(std::string(text_.substr(pos_, 4)).c_str(), nullptr, 16);
            pos_ += 4;
            c = code < 128 ? static_cast<char>(code) : '?';
            break;
          }
          default:
            c = e;  // \" \\ \/
        }
      }
      out->push_back(c);
    }
    if (pos_ >= text_.size()) return Error("unterminated string");
    ++pos_;
    return absl::OkStatus();
  }

  absl::Status ParseArray(int depth, JsonValue* value) {
    value->type = JsonValue::Type::kArray;
    ++pos_;
    SkipSpace();
    if (pos_ < text_.size() && text_[pos_] == ']') {
      ++pos_;
      return absl::OkStatus();
    }
    while (true) {
      value->items.emplace_back();
      if (absl::Status s = ParseValue(depth + 1, &value->items.back()); !s.ok()) return s;
      SkipSpace();
      if (Consume(",")) continue;
      if (Consume("]")) return absl::OkStatus();
      return Error("expected ',' or ']'");
    }
  }

  absl::Status ParseObject(int depth, JsonValue* value) {
    value->type = JsonValue::Type::kObject;
    ++pos_;
    SkipSpace();
    if (Consume("}")) return absl::OkStatus();
    while (true) {
      SkipSpace();
      if (pos_ >= text_.size() || text_[pos_] != '"') return Error("expected a member name");
      std::string key;
      if (absl::Status s = ParseString(&key); !s.ok()) return s;
      SkipSpace();
      if (!Consume(":")) return Error("expected ':'");
      value->members.emplace_back(std::move(key), JsonValue());
      if (absl::Status s = ParseValue(depth + 1, &value->members.back().second); !s.ok()) {
        return s;
      }
      SkipSpace();
      if (Consume(",")) continue;
      if (Consume("}")) return absl::OkStatus();
      return Error("expected ',' or '}'");
    }
  }

  absl::string_view text_;
  size_t pos_ = 0;
};

}  // namespace

const JsonValue* JsonValue::Find(absl::string_view key) const {
  for (const auto& [name, value] : members) {
    if (name == key) return &value;
  }
  return nullptr;
}

absl::StatusOr<JsonValue> ParseJson(absl::string_view text) { return Parser(text).ParseDocument(); }

std::string JsonQuote(absl::string_view text) {
  std::string out = "\"";
  for (const char c : text) {
    switch (c) {
      case '"':
        out += "\\\"";
        break;
      case '\\':
        out += "\\\\";
        break;
      case '\n':
        out += "\\n";
        break;
      case '\t':
        out += "\\t";
        break;
      default:
        if (static_cast<unsigned char>(c) < 0x20) {
          out += absl::StrCat("\\u00", absl::Hex(static_cast<unsigned char>(c), absl::kZeroPad2));
        } else {
          out.push_back(c);
        }
    }
  }
  out += "\"";
  return out;
}

}  // namespace entrokv::sim
