#include "sim/json.h"

#include "absl/status/status.h"
#include "core/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace entrokv::sim {
namespace {

using ::entrokv::testing::StatusIs;
using ::testing::HasSubstr;

TEST(JsonTest, ParsesWhatPythonJsonDumpWrites) {
  ENTROKV_ASSERT_OK_AND_ASSIGN(
      const JsonValue root,
      ParseJson("{\"a\": [1, 2.5e3, -3], \"b\": {\"c\": \"x\\\"y\\u0041\"}, \"d\": true, "
                "\"e\": null, \"f\": false}"));
  ASSERT_EQ(root.type, JsonValue::Type::kObject);
  const JsonValue* a = root.Find("a");
  ASSERT_NE(a, nullptr);
  ASSERT_EQ(a->items.size(), 3u);
  EXPECT_EQ(a->items[1].number, 2500.0);
  EXPECT_EQ(a->items[2].number, -3.0);
  EXPECT_EQ(root.Find("b")->Find("c")->text, "x\"yA");
  EXPECT_TRUE(root.Find("d")->boolean);
  EXPECT_EQ(root.Find("e")->type, JsonValue::Type::kNull);
  EXPECT_EQ(root.Find("missing"), nullptr);
}

TEST(JsonTest, QuoteRoundTrips) {
  const std::string text = "a\"b\\c\nd\x01";
  ENTROKV_ASSERT_OK_AND_ASSIGN(const JsonValue value, ParseJson(JsonQuote(text)));
  EXPECT_EQ(value.text, text);
}

TEST(JsonTest, MalformedInputIsInvalidArgumentWithOffset) {
  EXPECT_THAT(ParseJson("{\"a\": }"),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("byte")));
  EXPECT_THAT(ParseJson("[1, 2"),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("expected")));
  EXPECT_THAT(ParseJson("{} x"),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("trailing")));
  EXPECT_THAT(ParseJson(std::string(100, '[')),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("deep")));
}

}  // namespace
}  // namespace entrokv::sim
