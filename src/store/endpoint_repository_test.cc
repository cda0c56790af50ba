#include "store/endpoint_repository.h"

#include <gtest/gtest.h>

#include "store/test_util/temp_database.h"
#include "store/training_job_repository.h"

namespace kiln::store {
namespace {

using nlohmann::json;

constexpr const char* kPrefix = "arn:aws:sagemaker:us-east-1:123456789012:";

class EndpointRepositoryTest : public ::testing::Test {
 protected:
  void SetUp() override {
    db_ = testing::OpenTestDatabase(dir_.path(), /*durable=*/false);
    models_ = std::make_unique<DefinitionRepository>(db_.get(), DefinitionRepository::Kind::kModel);
    configs_ = std::make_unique<DefinitionRepository>(db_.get(), DefinitionRepository::Kind::kEndpointConfig);
    endpoints_ = std::make_unique<EndpointRepository>(db_.get());
    tags_ = std::make_unique<TagRepository>(db_.get());
  }
  static DefinitionRecord Model(const std::string& name, int64_t created) {
    return {name, std::string(kPrefix) + "model/" + name, {{"ModelName", name}}, created};
  }
  static EndpointRecord Endpoint(const std::string& name, int64_t created,
                                 EndpointStatus status = EndpointStatus::kCreating) {
    EndpointRecord r;
    r.name = name;
    r.arn = std::string(kPrefix) + "endpoint/" + name;
    r.config_name = "cfg";
    r.status = status;
    r.creation_millis = created;
    r.last_modified_millis = created;
    r.request = {{"EndpointName", name}, {"EndpointConfigName", "cfg"}};
    r.deployment.config_name = "cfg";
    r.deployment.endpoint_config = json::object();
    r.deployment.deployed_millis = created;
    r.desired = {{"AllTraffic", {.weight = 1.0, .instance_count = 1}}};
    return r;
  }
  testing::TempDir dir_;
  std::unique_ptr<Database> db_;
  std::unique_ptr<DefinitionRepository> models_, configs_;
  std::unique_ptr<EndpointRepository> endpoints_;
  std::unique_ptr<TagRepository> tags_;
};

TEST_F(EndpointRepositoryTest, DefinitionsAreUniqueCaseInsensitivelyPerKind) {
  ASSERT_TRUE(models_->Insert(Model("My-Model", 1000)).ok());
  Status dup = models_->Insert(Model("my-model", 2000));
  EXPECT_TRUE(dup.IsAlreadyExists());
  EXPECT_EQ(dup.message(), std::string(kPrefix) + "model/My-Model");  // the existing row's ARN
  // Another kind may use the same name.
  EXPECT_TRUE(configs_->Insert(Model("My-Model", 1000)).ok());
  auto got = models_->Get("MY-MODEL");
  ASSERT_TRUE(got.ok());
  EXPECT_EQ(got->name, "My-Model");
  EXPECT_EQ(got->request["ModelName"], "My-Model");
  EXPECT_EQ(got->creation_millis, 1000);
  EXPECT_TRUE(models_->Get("other").status().IsNotFound());
}

TEST_F(EndpointRepositoryTest, DefinitionListFiltersInCreationOrder) {
  ASSERT_TRUE(models_->Insert(Model("alpha", 1000)).ok());
  ASSERT_TRUE(models_->Insert(Model("Beta", 2000)).ok());
  ASSERT_TRUE(models_->Insert(Model("alphabet", 3000)).ok());
  auto all = models_->List({});
  ASSERT_TRUE(all.ok());
  ASSERT_EQ(all->size(), 3u);
  EXPECT_EQ((*all)[0].name, "alpha");
  EXPECT_EQ((*all)[2].name, "alphabet");

  DefinitionListQuery q;
  q.name_contains = "ALPHA";
  auto named = models_->List(q);
  ASSERT_TRUE(named.ok());
  EXPECT_EQ(named->size(), 2u);

  DefinitionListQuery times;
  times.creation_after_millis = 1000;  // exclusive
  times.creation_before_millis = 3000;
  auto between = models_->List(times);
  ASSERT_TRUE(between.ok());
  ASSERT_EQ(between->size(), 1u);
  EXPECT_EQ((*between)[0].name, "Beta");
}

TEST_F(EndpointRepositoryTest, DefinitionDeleteRemovesTagsOnly) {
  auto model = Model("m", 1000);
  ASSERT_TRUE(models_->Insert(model).ok());
  ASSERT_TRUE(tags_->Add(model.arn, {{"team", "a"}}).ok());
  ASSERT_TRUE(tags_->Add(std::string(kPrefix) + "model/other", {{"keep", "b"}}).ok());
  ASSERT_TRUE(models_->Delete("M").ok());
  EXPECT_TRUE(models_->Get("m").status().IsNotFound());
  EXPECT_TRUE(tags_->List(model.arn)->empty());
  EXPECT_EQ(tags_->List(std::string(kPrefix) + "model/other")->size(), 1u);
  EXPECT_TRUE(models_->Delete("m").IsNotFound());
}

TEST_F(EndpointRepositoryTest, EndpointInsertGetRoundTripsEveryMember) {
  auto e = Endpoint("Ep-1", 1000);
  e.pending = Deployment();
  e.pending->config_name = "cfg2";
  e.state.production_variants.emplace_back().variant_name = "AllTraffic";
  e.failure_reason = "boom";
  ASSERT_TRUE(endpoints_->Insert(e).ok());
  EXPECT_EQ(e.version, 1);
  auto dup = Endpoint("EP-1", 2000);
  Status s = endpoints_->Insert(dup);
  EXPECT_TRUE(s.IsAlreadyExists());
  EXPECT_EQ(s.message(), e.arn);

  auto got = endpoints_->Get("ep-1");
  ASSERT_TRUE(got.ok());
  EXPECT_EQ(got->name, "Ep-1");
  EXPECT_EQ(got->arn, e.arn);
  EXPECT_EQ(got->config_name, "cfg");
  EXPECT_EQ(got->status, EndpointStatus::kCreating);
  EXPECT_EQ(got->failure_reason, "boom");
  EXPECT_EQ(got->request, e.request);
  EXPECT_EQ(got->deployment, e.deployment);
  EXPECT_EQ(got->pending, e.pending);
  EXPECT_EQ(got->desired, e.desired);
  EXPECT_EQ(got->state, e.state);
  EXPECT_EQ(got->version, 1);

  auto plain = Endpoint("plain", 1000);
  ASSERT_TRUE(endpoints_->Insert(plain).ok());
  EXPECT_FALSE(endpoints_->Get("plain")->pending.has_value());
}

TEST_F(EndpointRepositoryTest, MutateWritesAtomicallyAndAbortsOnError) {
  auto e = Endpoint("ep", 1000);
  ASSERT_TRUE(endpoints_->Insert(e).ok());
  auto r = endpoints_->Mutate("EP", [](EndpointRecord& rec) {
    rec.status = EndpointStatus::kInService;
    rec.state.production_variants.clear();
    rec.pending = Deployment();
    rec.pending->config_name = "next";
    rec.last_modified_millis = 5000;
    return Status::Ok();
  });
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->version, 2);
  EXPECT_EQ(r->status, EndpointStatus::kInService);

  auto failed = endpoints_->Mutate("ep", [](EndpointRecord& rec) {
    rec.status = EndpointStatus::kFailed;
    return Status::FailedPrecondition("refused");
  });
  EXPECT_EQ(failed.status().code(), StatusCode::kFailedPrecondition);
  auto got = endpoints_->Get("ep");
  ASSERT_TRUE(got.ok());
  EXPECT_EQ(got->status, EndpointStatus::kInService);
  EXPECT_EQ(got->version, 2);
  EXPECT_EQ(got->last_modified_millis, 5000);
  ASSERT_TRUE(got->pending.has_value());
  EXPECT_EQ(got->pending->config_name, "next");

  // Clearing pending writes NULL back.
  ASSERT_TRUE(endpoints_
                  ->Mutate("ep",
                           [](EndpointRecord& rec) {
                             rec.pending.reset();
                             return Status::Ok();
                           })
                  .ok());
  EXPECT_FALSE(endpoints_->Get("ep")->pending.has_value());
  EXPECT_TRUE(endpoints_->Mutate("missing", [](EndpointRecord&) { return Status::Ok(); }).status().IsNotFound());
}

TEST_F(EndpointRepositoryTest, EndpointListFilters) {
  auto a = Endpoint("alpha", 1000, EndpointStatus::kInService);
  auto b = Endpoint("Beta", 2000, EndpointStatus::kCreating);
  auto c = Endpoint("alphabet", 3000, EndpointStatus::kInService);
  c.last_modified_millis = 9000;
  for (auto* e : {&a, &b, &c}) ASSERT_TRUE(endpoints_->Insert(*e).ok());

  auto all = endpoints_->List({});
  ASSERT_TRUE(all.ok());
  ASSERT_EQ(all->size(), 3u);
  EXPECT_EQ((*all)[1].name, "Beta");

  EndpointListQuery status;
  status.status_equals = "InService";
  EXPECT_EQ(endpoints_->List(status)->size(), 2u);

  EndpointListQuery named;
  named.name_contains = "BET";
  auto n = endpoints_->List(named);
  ASSERT_EQ(n->size(), 2u);  // Beta, alphabet

  EndpointListQuery modified;
  modified.modified_after_millis = 2000;
  auto m = endpoints_->List(modified);
  ASSERT_EQ(m->size(), 1u);
  EXPECT_EQ((*m)[0].name, "alphabet");

  EndpointListQuery created;
  created.creation_before_millis = 2000;
  created.status_equals = "InService";
  auto cr = endpoints_->List(created);
  ASSERT_EQ(cr->size(), 1u);
  EXPECT_EQ((*cr)[0].name, "alpha");
}

TEST_F(EndpointRepositoryTest, EndpointDeleteRemovesItsTags) {
  auto e = Endpoint("ep", 1000);
  ASSERT_TRUE(endpoints_->Insert(e).ok());
  // Tags keyed by an ARN spelt in another case are the same resource's (§5).
  std::string lower_arn = std::string(kPrefix) + "endpoint/EP";
  ASSERT_TRUE(tags_->Add(lower_arn, {{"k", "v"}}).ok());
  ASSERT_TRUE(endpoints_->Delete("Ep").ok());
  EXPECT_TRUE(tags_->List(e.arn)->empty());
  EXPECT_TRUE(endpoints_->Get("ep").status().IsNotFound());
  EXPECT_TRUE(endpoints_->Delete("ep").IsNotFound());
}

}  // namespace
}  // namespace kiln::store
