#include "base/regex.h"

#include <gtest/gtest.h>

#include <string>
#include <thread>
#include <vector>

namespace kiln {
namespace {

TEST(RegexTest, SearchAndFirstGroup) {
  auto regex = Regex::Compile("Train Loss = (.*?);");
  ASSERT_TRUE(regex.ok()) << regex.status().ToString();
  EXPECT_EQ(regex->capture_count(), 1);
  EXPECT_TRUE(regex->Search("Epoch 3 Train Loss = 0.4131; Val Accuracy = 0.8184"));
  EXPECT_EQ(regex->SearchFirstGroup("Epoch 3 Train Loss = 0.4131; Val Accuracy = 0.8184"), "0.4131");
  EXPECT_FALSE(regex->SearchFirstGroup("Epoch 3 Val Accuracy = 0.8184").has_value());
  EXPECT_FALSE(regex->FullMatch("Epoch 3 Train Loss = 0.4131;"));
  EXPECT_TRUE(regex->FullMatch("Train Loss = 0.4131;"));
}

TEST(RegexTest, GroupThatDidNotParticipateIsNullopt) {
  auto regex = Regex::Compile("a(x)?b|c");
  ASSERT_TRUE(regex.ok());
  EXPECT_FALSE(regex->SearchFirstGroup("c").has_value());
  EXPECT_EQ(regex->SearchFirstGroup("axb"), "x");
  auto no_group = Regex::Compile("loss=[0-9.]+");
  ASSERT_TRUE(no_group.ok());
  EXPECT_TRUE(no_group->Search("loss=1.5"));
  EXPECT_FALSE(no_group->SearchFirstGroup("loss=1.5").has_value());
}

TEST(RegexTest, FullMatchModeIsAnchoredBothEnds) {
  auto name = Regex::Compile("[a-zA-Z0-9](-*[a-zA-Z0-9]){0,62}", {.mode = Regex::Mode::kFullMatch});
  ASSERT_TRUE(name.ok());
  EXPECT_TRUE(name->Match("my-job-1"));
  EXPECT_FALSE(name->Match("x y"));
  EXPECT_FALSE(name->Match("-abc"));
  EXPECT_FALSE(name->Match("abc-"));
  EXPECT_FALSE(name->Match("abc\n"));
  EXPECT_FALSE(name->Match(""));
  EXPECT_TRUE(name->Match(std::string(63, 'a')));
  EXPECT_FALSE(name->Match(std::string(64, 'a')));
  // Patterns that already carry ^...$ still work anchored.
  auto explicit_anchors = Regex::Compile("^[a-z]+$", {.mode = Regex::Mode::kFullMatch});
  ASSERT_TRUE(explicit_anchors.ok());
  EXPECT_TRUE(explicit_anchors->Match("abc"));
  EXPECT_FALSE(explicit_anchors->Match("abc\n"));
}

TEST(RegexTest, UnicodeProperties) {
  auto tag = Regex::Compile(R"(([\p{L}\p{Z}\p{N}_.:/=+\-@]*))", {.mode = Regex::Mode::kFullMatch, .ucp = false});
  ASSERT_TRUE(tag.ok()) << tag.status().ToString();
  EXPECT_TRUE(tag->Match("Équipe 東京 42"));
  EXPECT_FALSE(tag->Match("bad#key"));
  // UCP on: \d matches non-ASCII digits (Python 3); off: ASCII only (Java).
  auto ucp = Regex::Compile(R"(\d+)", {.mode = Regex::Mode::kFullMatch, .ucp = true});
  auto ascii = Regex::Compile(R"(\d+)", {.mode = Regex::Mode::kFullMatch, .ucp = false});
  ASSERT_TRUE(ucp.ok() && ascii.ok());
  EXPECT_TRUE(ucp->Match("\xd9\xa3"));  // ARABIC-INDIC DIGIT THREE
  EXPECT_FALSE(ascii->Match("\xd9\xa3"));
  // A dot is one code point, not one byte.
  auto one = Regex::Compile(".", {.mode = Regex::Mode::kFullMatch});
  ASSERT_TRUE(one.ok());
  EXPECT_TRUE(one->Match("é"));
}

TEST(RegexTest, InvalidUtf8SubjectDoesNotMatchButDoesNotFail) {
  auto regex = Regex::Compile("loss=([0-9.]+)");
  ASSERT_TRUE(regex.ok());
  EXPECT_EQ(regex->SearchFirstGroup(std::string("\xff\xfe loss=0.5", 11)), "0.5");
}

TEST(RegexTest, CompileErrorNamesMessageAndOffset) {
  auto regex = Regex::Compile("abc(def");
  ASSERT_FALSE(regex.ok());
  EXPECT_TRUE(regex.status().IsInvalidArgument());
  EXPECT_NE(regex.status().message().find("missing closing parenthesis"), std::string::npos)
      << regex.status().message();
  EXPECT_NE(regex.status().message().find("at offset 7"), std::string::npos) << regex.status().message();
}

TEST(RegexTest, ManyGroupsUseOwnMatchData) {
  std::string pattern;
  for (int i = 0; i < 20; ++i) {
    pattern += "(a)";
  }
  auto regex = Regex::Compile(pattern);
  ASSERT_TRUE(regex.ok());
  EXPECT_EQ(regex->capture_count(), 20);
  EXPECT_EQ(regex->SearchFirstGroup("x" + std::string(20, 'a')), "a");
}

TEST(RegexTest, ConcurrentUseFromManyThreads) {
  auto regex = Regex::Compile("value=([0-9]+)");
  ASSERT_TRUE(regex.ok());
  const Regex shared = *regex;  // copies share the compiled code
  std::vector<std::thread> threads;
  std::vector<int> failures(8, 0);
  for (int t = 0; t < 8; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < 2000; ++i) {
        std::string line = "step value=" + std::to_string(t * 10000 + i) + " end";
        auto group = shared.SearchFirstGroup(line);
        if (!group || *group != std::to_string(t * 10000 + i)) {
          ++failures[t];
        }
      }
    });
  }
  for (auto& thread : threads) {
    thread.join();
  }
  for (int t = 0; t < 8; ++t) {
    EXPECT_EQ(failures[t], 0);
  }
}

}  // namespace
}  // namespace kiln
