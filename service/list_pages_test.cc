#include "service/list_pages.h"

#include <string>

#include "core/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace entrokv::service {
namespace {

using ::entrokv::testing::StatusIs;
using ::testing::HasSubstr;

TEST(ListPagesTest, PageSizeHasADefaultAndAMaximum) {
  EXPECT_EQ(ListPageSize(0).value(), kDefaultListPageSize);
  EXPECT_EQ(ListPageSize(7).value(), 7);
  EXPECT_EQ(ListPageSize(kMaxListPageSize).value(), kMaxListPageSize);
  EXPECT_EQ(ListPageSize(kMaxListPageSize + 1).value(), kMaxListPageSize);
  EXPECT_THAT(ListPageSize(-1),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("page_size")));
}

TEST(ListPagesTest, TokensRoundTripAndForgeriesAreRefused) {
  EXPECT_EQ(DecodePageToken("").value(), "");
  for (const std::string id : {"a", "seq-0042", "tenant/7:req.9_x"}) {
    const std::string token = EncodePageToken(id);
    EXPECT_EQ(DecodePageToken(token).value(), id);
  }
  for (const std::string& bad :
       {std::string("seq-0042"), std::string("!!!"), EncodePageToken("").substr(0, 5),
        EncodePageToken("has space"), EncodePageToken(std::string(200, 'x'))}) {
    EXPECT_THAT(DecodePageToken(bad),
                StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("page_token")))
        << bad;
  }
}

}  // namespace
}  // namespace entrokv::service
