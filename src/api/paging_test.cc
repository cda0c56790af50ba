#include "api/paging.h"

#include <gtest/gtest.h>

#include "base/encoding.h"

namespace kiln::api {
namespace {

using nlohmann::json;

constexpr int64_t kNow = 1'800'000'000'000;

struct Row {
  std::string name;
  int64_t creation_millis = 0;
  std::string status;
};

ListPaging Parse(const json& in, store::ListSortKey sort = store::ListSortKey::kCreationTime, int64_t now = kNow) {
  auto parsed = ParseListPaging(in, sort, false, now);
  EXPECT_TRUE(std::holds_alternative<ListPaging>(parsed));
  return std::holds_alternative<ListPaging>(parsed) ? std::get<ListPaging>(parsed) : ListPaging{};
}

bool Invalid(const json& in, store::ListSortKey sort = store::ListSortKey::kCreationTime, int64_t now = kNow) {
  auto parsed = ParseListPaging(in, sort, false, now);
  const auto* error = std::get_if<aws::AwsError>(&parsed);
  return error != nullptr && error->code == "ValidationException" &&
         error->message == "The provided NextToken is invalid.";
}

TEST(PagingTest, ReadsOneRowMoreThanAPageAndCutsIt) {
  ListPaging p = Parse({{"NameContains", "x"}});
  EXPECT_EQ(p.max_results, 10u);
  EXPECT_EQ(p.query.limit, 11u);
  EXPECT_FALSE(p.query.after);
  p = Parse({{"MaxResults", 2}});
  std::vector<Row> rows = {{"a", 1, ""}, {"B", 2, ""}};
  EXPECT_FALSE(CutPage(rows, p, json{{"MaxResults", 2}}, kNow));  // exactly a page: no next page
  rows.push_back({"c", 3, ""});
  auto token = CutPage(rows, p, json{{"MaxResults", 2}}, kNow);
  ASSERT_TRUE(token);
  EXPECT_EQ(rows.size(), 2u);
  // The token resumes after the last row shown, under the same filters and any MaxResults.
  ListPaging next = Parse({{"MaxResults", 5}, {"NextToken", *token}});
  ASSERT_TRUE(next.query.after);
  EXPECT_EQ(std::get<int64_t>(next.query.after->key), 2);
  EXPECT_EQ(next.query.after->name, "B");
}

TEST(PagingTest, CursorKeysFollowTheSortKey) {
  std::vector<Row> rows = {{"Job-A", 5, "Failed"}, {"Job-B", 6, "Completed"}};
  ListPaging p = Parse({{"MaxResults", 1}}, store::ListSortKey::kStatus);
  auto token = CutPage(rows, p, json{{"MaxResults", 1}}, kNow);
  ASSERT_TRUE(token);
  ListPaging next = Parse({{"NextToken", *token}}, store::ListSortKey::kStatus);
  EXPECT_EQ(std::get<std::string>(next.query.after->key), "Failed");
  // A status cursor replayed where creation time is the sort key has the wrong type.
  EXPECT_TRUE(Invalid({{"NextToken", *token}}, store::ListSortKey::kCreationTime));
}

TEST(PagingTest, RefusesForeignExpiredAndMalformedTokens) {
  const json first = {{"NameContains", "a"}};
  const std::string token = EncodeNextToken({{"k", 5}, {"n", "x"}}, first, kNow);
  EXPECT_FALSE(Invalid({{"NameContains", "a"}, {"NextToken", token}}));
  EXPECT_TRUE(Invalid({{"NameContains", "b"}, {"NextToken", token}}));  // other filters
  EXPECT_TRUE(Invalid({{"NameContains", "a"}, {"NextToken", token}}, store::ListSortKey::kCreationTime,
                      kNow + 24LL * 3600 * 1000 + 1));  // older than 24 h
  EXPECT_TRUE(Invalid({{"NextToken", "definitely-not-a-token"}}));
  EXPECT_TRUE(Invalid({{"NextToken", EncodeNextToken(json::array({1, 2}), json::object(), kNow)}}));
  EXPECT_TRUE(Invalid({{"NextToken", EncodeNextToken({{"k", 1}}, json::object(), kNow)}}));
  EXPECT_TRUE(Invalid({{"NextToken", EncodeNextToken({{"k", 1}, {"n", 7}}, json::object(), kNow)}}));
  EXPECT_TRUE(Invalid({{"NextToken", Base64Encode(R"({"c":{"k":1,"n":"x"},"f":7,"t":0})")}}));
  // A null NextToken is no token (absent and null mean the same).
  EXPECT_FALSE(Parse({{"NextToken", nullptr}}).query.after);
}

TEST(PagingTest, ListTagsCursorRoundTrips) {
  const json in = {{"ResourceArn", "arn:x"}};
  auto cursor = DecodeNextToken(EncodeNextToken(json(50), in, kNow), in, kNow);
  ASSERT_TRUE(cursor);
  EXPECT_EQ(*cursor, 50);
  EXPECT_FALSE(DecodeNextToken(EncodeNextToken(json(50), in, kNow), json{{"ResourceArn", "arn:y"}}, kNow));
}

}  // namespace
}  // namespace kiln::api
