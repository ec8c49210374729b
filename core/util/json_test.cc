#include "core/util/json.h"

#include <cmath>

#include "absl/status/status.h"
#include "core/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace entrokv {
namespace {

using ::entrokv::testing::StatusIs;
using ::testing::HasSubstr;

TEST(JsonTest, ParsesWhatPythonJsonDumpWrites) {
  ENTROKV_ASSERT_OK_AND_ASSIGN(
      const Json root,
      ParseJson("{\"a\": [1, 2.5e3, -3], \"b\": {\"c\": \"x\\\"y\\u0041\\u00e9\"}, \"d\": true, "
                "\"e\": null, \"f\": false}",
                "doc"));
  ASSERT_TRUE(root.is_object());
  ASSERT_EQ(root["a"].size(), 3u);
  EXPECT_EQ(root["a"][1].get<double>(), 2500.0);
  EXPECT_EQ(root["a"][2].get<double>(), -3.0);
  EXPECT_EQ(root["b"]["c"].get<std::string>(), "x\"yA\xc3\xa9");
  EXPECT_TRUE(root["d"].get<bool>());
  EXPECT_TRUE(root["e"].is_null());
  EXPECT_FALSE(root.contains("missing"));
}

TEST(JsonTest, MalformedInputIsInvalidArgumentNamingTheDocument) {
  for (const char* text : {"{\"a\": }", "[1, 2", "{} x", ""}) {
    EXPECT_THAT(ParseJson(text, "trace.json"),
                StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("trace.json")))
        << text;
  }
}

TEST(JsonTest, DumpKeepsInsertionOrderAndIsCompactByDefault) {
  Json object;
  object["zeta"] = 1;
  object["alpha"] = "a\"b\n";
  object["list"] = Json::array({1, 2});
  EXPECT_EQ(DumpJson(object), "{\"zeta\":1,\"alpha\":\"a\\\"b\\n\",\"list\":[1,2]}");
  EXPECT_EQ(DumpJson(Json::object({{"k", 1}}), 2), "{\n  \"k\": 1\n}");
}

TEST(JsonTest, DumpReplacesInvalidUtf8InsteadOfThrowing) {
  const Json value = std::string("ok\xff");
  EXPECT_EQ(DumpJson(value), "\"ok\xef\xbf\xbd\"");
}

TEST(JsonTest, RoundToKeepsTheGivenDecimals) {
  EXPECT_EQ(DumpJson(RoundTo(2.16499999999, 4)), "2.165");
  EXPECT_EQ(RoundTo(-1.23456, 2), -1.23);
  EXPECT_TRUE(std::isinf(RoundTo(INFINITY, 3)));
}

}  // namespace
}  // namespace entrokv
