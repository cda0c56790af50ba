#include "control/tuning_strategy.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <set>
#include <string>
#include <utility>

namespace kiln::control::tuning {
namespace {

constexpr double kPi = 3.14159265358979323846;

uint64_t SplitMix64(uint64_t& state) {
  uint64_t z = (state += 0x9e3779b97f4a7c15ULL);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

// One independent stream per (seed, trial, purpose): the same trial gets the same draws whatever
// happened before it, which is what makes Next deterministic in (seed, trial_index, observations).
uint64_t StreamSeed(uint64_t seed, int trial_index, uint64_t purpose) {
  uint64_t state = seed;
  uint64_t a = SplitMix64(state);
  state = a ^ (static_cast<uint64_t>(static_cast<int64_t>(trial_index)) * 0xd1b54a32d192ed03ULL);
  uint64_t b = SplitMix64(state);
  state = b ^ (purpose * 0x8cb92ba72f3d8dd7ULL);
  return SplitMix64(state);
}

constexpr uint64_t kPurposeSample = 1;
constexpr uint64_t kPurposeBayes = 2;

// An observation's values restricted to the space's parameters: what "the same configuration"
// compares (a warm-start parent may carry other tuned hyperparameters).
Assignment Project(const SearchSpace& space, const Assignment& values) {
  Assignment out;
  for (const Parameter& p : space.parameters()) {
    auto it = values.find(p.name);
    if (it != values.end()) out[p.name] = it->second;
  }
  return out;
}

bool HasLoss(const Observation& o) { return o.loss.has_value() && std::isfinite(*o.loss); }

// A uniform point: numeric coordinates uniform in [0, 1], each categorical block one-hot with a
// uniformly chosen value.
std::vector<double> SampleUnit(const SearchSpace& space, Rng& rng) {
  std::vector<double> u(space.encoded_dimensions(), 0.0);
  const std::vector<Parameter>& params = space.parameters();
  for (size_t i = 0; i < params.size(); ++i) {
    if (params[i].kind == ParameterKind::kCategorical) {
      size_t k = params[i].values.size();
      size_t pick = std::min(k - 1, static_cast<size_t>(rng.Uniform() * static_cast<double>(k)));
      u[space.offset(i) + pick] = 1.0;
    } else {
      u[space.offset(i)] = rng.Uniform();
    }
  }
  return u;
}

// Draws until the configuration is not among `seen` (at most kTries draws; the last one is
// returned when the space is (nearly) exhausted, as a repeat is better than no trial).
Assignment SampleFresh(const SearchSpace& space, Rng& rng, const std::set<Assignment>& seen) {
  constexpr int kTries = 64;
  Assignment a;
  for (int attempt = 0; attempt < kTries; ++attempt) {
    a = space.Decode(SampleUnit(space, rng));
    if (!seen.count(a)) break;
  }
  return a;
}

std::set<Assignment> SeenSet(const SearchSpace& space, const std::vector<Observation>& observations) {
  std::set<Assignment> seen;
  for (const Observation& o : observations) seen.insert(Project(space, o.values));
  return seen;
}

class RandomStrategy : public Strategy {
 public:
  RandomStrategy(SearchSpace space, uint64_t seed) : space_(std::move(space)), seed_(seed) {}

  // Strategy
  std::optional<Assignment> Next(const std::vector<Observation>& observations, int trial_index) override {
    Rng rng(StreamSeed(seed_, trial_index, kPurposeSample));
    return SampleFresh(space_, rng, SeenSet(space_, observations));
  }

 private:
  SearchSpace space_;
  uint64_t seed_;
};

class GridStrategy : public Strategy {
 public:
  explicit GridStrategy(SearchSpace space) : space_(std::move(space)) {}

  // Strategy
  std::optional<Assignment> Next(const std::vector<Observation>&, int trial_index) override {
    if (trial_index < 0 || static_cast<uint64_t>(trial_index) >= space_.grid_size()) return std::nullopt;
    return space_.GridPoint(static_cast<uint64_t>(trial_index));
  }

 private:
  SearchSpace space_;
};

// ---- Gaussian process -------------------------------------------------------------------------

double Matern52(double r2) {
  double r = std::sqrt(std::max(r2, 0.0));
  double s5r = std::sqrt(5.0) * r;
  return (1.0 + s5r + 5.0 / 3.0 * r2) * std::exp(-s5r);
}

// In-place Cholesky of the n×n row-major symmetric matrix `a` (lower triangle used and
// overwritten with L). False when it is not positive definite.
bool Cholesky(std::vector<double>& a, size_t n) {
  for (size_t j = 0; j < n; ++j) {
    double* row_j = &a[j * n];
    double d = row_j[j];
    for (size_t k = 0; k < j; ++k) d -= row_j[k] * row_j[k];
    if (!(d > 0)) return false;
    d = std::sqrt(d);
    row_j[j] = d;
    for (size_t i = j + 1; i < n; ++i) {
      double* row_i = &a[i * n];
      double s = row_i[j];
      for (size_t k = 0; k < j; ++k) s -= row_i[k] * row_j[k];
      row_i[j] = s / d;
    }
  }
  return true;
}

// Solves L x = b (forward substitution) in place.
void SolveLower(const std::vector<double>& l, size_t n, std::vector<double>& b) {
  for (size_t i = 0; i < n; ++i) {
    const double* row = &l[i * n];
    double s = b[i];
    for (size_t k = 0; k < i; ++k) s -= row[k] * b[k];
    b[i] = s / row[i];
  }
}

// Solves Lᵀ x = b (back substitution) in place.
void SolveUpper(const std::vector<double>& l, size_t n, std::vector<double>& b) {
  for (size_t i = n; i-- > 0;) {
    double s = b[i];
    for (size_t k = i + 1; k < n; ++k) s -= l[k * n + i] * b[k];
    b[i] = s / l[i * n + i];
  }
}

struct Kernel {
  std::vector<double> inv_ls2;  // per parameter: 1 / length-scale²
  double noise = 1e-4;          // noise variance relative to the signal variance
};

constexpr double kJitter = 1e-6;
// Weak log-normal prior on each length-scale (unit-cube coordinates): centred at 0.5, sd 1.5 in log.
constexpr double kPriorLogMean = -0.6931471805599453;
constexpr double kPriorLogSd = 1.5;
constexpr double kMinLengthScale = 0.01, kMaxLengthScale = 20.0;

// Points and their per-parameter squared distances, precomputed so that a kernel with new
// length-scales costs one weighted sum per pair.
class GpData {
 public:
  GpData(const SearchSpace& space, std::vector<std::vector<double>> x, std::vector<double> y)
      : space_(&space), x_(std::move(x)), y_(std::move(y)) {
    size_t n = x_.size(), p = space.parameters().size();
    d2_.assign(p * n * n, 0.0);
    for (size_t param = 0; param < p; ++param) {
      auto [begin, width] = Block(param);
      double* d = &d2_[param * n * n];
      for (size_t a = 0; a < n; ++a) {
        for (size_t b = a + 1; b < n; ++b) {
          double s = 0;
          for (size_t k = begin; k < begin + width; ++k) {
            double diff = x_[a][k] - x_[b][k];
            s += diff * diff;
          }
          d[a * n + b] = d[b * n + a] = s;
        }
      }
    }
  }

  size_t size() const { return x_.size(); }
  const std::vector<std::vector<double>>& x() const { return x_; }
  const std::vector<double>& y() const { return y_; }

  std::pair<size_t, size_t> Block(size_t param) const {
    const Parameter& p = space_->parameters()[param];
    return {space_->offset(param), p.kind == ParameterKind::kCategorical ? p.values.size() : 1};
  }

  // R = k(X, X) + (noise + jitter) I in `r` (row-major); the kernel's signal variance is 1.
  void Correlation(const Kernel& kernel, std::vector<double>& r) const {
    size_t n = size(), p = kernel.inv_ls2.size();
    r.assign(n * n, 0.0);
    for (size_t a = 0; a < n; ++a) {
      for (size_t b = 0; b < a; ++b) {
        double r2 = 0;
        for (size_t param = 0; param < p; ++param) r2 += d2_[param * n * n + a * n + b] * kernel.inv_ls2[param];
        r[a * n + b] = r[b * n + a] = Matern52(r2);
      }
      r[a * n + a] = 1.0 + kernel.noise + kJitter;
    }
  }

  // Log marginal likelihood with the signal variance profiled out, plus the length-scale prior.
  // -inf when the matrix is not positive definite.
  double Objective(const Kernel& kernel, std::vector<double>& scratch) const {
    size_t n = size();
    Correlation(kernel, scratch);
    if (!Cholesky(scratch, n)) return -std::numeric_limits<double>::infinity();
    std::vector<double> alpha = y_;
    SolveLower(scratch, n, alpha);
    double q = 0, log_det = 0;
    for (size_t i = 0; i < n; ++i) {
      q += alpha[i] * alpha[i];
      log_det += std::log(scratch[i * n + i]);
    }
    double s2 = std::max(q / static_cast<double>(n), 1e-12);
    double lml = -0.5 * static_cast<double>(n) * (std::log(s2) + 1.0 + std::log(2 * kPi)) - log_det;
    for (double inv : kernel.inv_ls2) {
      double z = (-0.5 * std::log(inv) - kPriorLogMean) / kPriorLogSd;
      lml -= 0.5 * z * z;
    }
    return lml;
  }

 private:
  const SearchSpace* space_;
  std::vector<std::vector<double>> x_;
  std::vector<double> y_;
  std::vector<double> d2_;  // [param][a][b]
};

// Kernel hyperparameters by MAP: a grid over (shared length-scale, noise), then coordinate sweeps
// over each parameter's length-scale, then the noise again.
Kernel FitKernel(const GpData& data, size_t params) {
  std::vector<double> scratch;
  Kernel best;
  double best_value = -std::numeric_limits<double>::infinity();
  auto consider = [&](const Kernel& k) {
    double v = data.Objective(k, scratch);
    if (v > best_value) {
      best_value = v;
      best = k;
    }
  };
  for (double ls : {0.05, 0.1, 0.2, 0.35, 0.6, 1.0, 2.0, 5.0}) {
    for (double noise : {1e-6, 1e-4, 1e-2, 0.1}) {
      Kernel k;
      k.inv_ls2.assign(params, 1.0 / (ls * ls));
      k.noise = noise;
      consider(k);
    }
  }
  if (best.inv_ls2.empty()) best.inv_ls2.assign(params, 1.0 / (0.35 * 0.35));  // nothing was PD: a safe default
  if (params > 1) {
    for (int sweep = 0; sweep < 2; ++sweep) {
      bool improved = false;
      for (size_t param = 0; param < params; ++param) {
        for (double factor : {0.3, 0.6, 1.6, 3.0}) {
          Kernel k = best;
          double ls = std::clamp(factor / std::sqrt(k.inv_ls2[param]), kMinLengthScale, kMaxLengthScale);
          k.inv_ls2[param] = 1.0 / (ls * ls);
          double before = best_value;
          consider(k);
          improved |= best_value > before;
        }
      }
      if (!improved) break;
    }
  }
  for (double noise : {1e-6, 1e-5, 1e-4, 1e-3, 1e-2, 0.03, 0.1, 0.3}) {
    Kernel k = best;
    k.noise = noise;
    consider(k);
  }
  return best;
}

// A GP conditioned on data with a fixed kernel: predictions of the latent function.
class GpModel {
 public:
  GpModel(const GpData& data, Kernel kernel) : data_(&data), kernel_(std::move(kernel)) {
    size_t n = data.size();
    for (int attempt = 0; attempt < 6; ++attempt) {
      data.Correlation(kernel_, l_);
      if (Cholesky(l_, n)) break;
      kernel_.noise = std::max(kernel_.noise * 10, 1e-6);  // ill-conditioned: more noise, retry
    }
    alpha_ = data.y();
    SolveLower(l_, n, alpha_);
    double q = 0;
    for (double a : alpha_) q += a * a;
    s2_ = std::max(q / static_cast<double>(std::max<size_t>(n, 1)), 1e-12);
    SolveUpper(l_, n, alpha_);  // alpha = R⁻¹ y
  }

  // Mean and standard deviation at the unit point `x`.
  std::pair<double, double> Predict(const SearchSpace& space, const std::vector<double>& x) const {
    size_t n = data_->size(), p = kernel_.inv_ls2.size();
    std::vector<double> k(n);
    for (size_t j = 0; j < n; ++j) {
      const std::vector<double>& xj = data_->x()[j];
      double r2 = 0;
      for (size_t param = 0; param < p; ++param) {
        size_t begin = space.offset(param);
        const Parameter& par = space.parameters()[param];
        size_t width = par.kind == ParameterKind::kCategorical ? par.values.size() : 1;
        double s = 0;
        for (size_t d = begin; d < begin + width; ++d) {
          double diff = x[d] - xj[d];
          s += diff * diff;
        }
        r2 += s * kernel_.inv_ls2[param];
      }
      k[j] = Matern52(r2);
    }
    double mean = 0;
    for (size_t j = 0; j < n; ++j) mean += k[j] * alpha_[j];
    SolveLower(l_, n, k);
    double explained = 0;
    for (double v : k) explained += v * v;
    double var = s2_ * std::max(1.0 - explained, 1e-12);
    return {mean, std::sqrt(var)};
  }

 private:
  const GpData* data_;
  Kernel kernel_;
  std::vector<double> l_;
  std::vector<double> alpha_;
  double s2_ = 1.0;
};

double ExpectedImprovement(double best, double mean, double sd) {
  constexpr double kXi = 0.01;  // a small margin (standardised units) that favours real improvement
  double gain = best - mean - kXi;
  if (sd < 1e-12) return std::max(gain, 0.0);
  double z = gain / sd;
  double cdf = 0.5 * std::erfc(-z / std::sqrt(2.0));
  double pdf = std::exp(-0.5 * z * z) / std::sqrt(2 * kPi);
  return gain * cdf + sd * pdf;
}

// Indices of a subset of at most `cap` of `losses`: the best cap/2 and the rest drawn by `rng`.
std::vector<size_t> Subset(const std::vector<double>& losses, size_t cap, Rng& rng) {
  std::vector<size_t> order(losses.size());
  std::iota(order.begin(), order.end(), 0);
  if (order.size() <= cap) return order;
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) { return losses[a] < losses[b]; });
  std::vector<size_t> rest(order.begin() + static_cast<std::ptrdiff_t>(cap / 2), order.end());
  order.resize(cap / 2);
  for (size_t i = 0; i < rest.size() && order.size() < cap; ++i) {
    size_t j = i + static_cast<size_t>(rng.Uniform() * static_cast<double>(rest.size() - i));
    std::swap(rest[i], rest[std::min(j, rest.size() - 1)]);
    order.push_back(rest[i]);
  }
  std::sort(order.begin(), order.end());
  return order;
}

void CapOutliers(std::vector<double>& y) {
  if (y.size() < 4) return;
  std::vector<double> sorted = y;
  std::sort(sorted.begin(), sorted.end());
  auto quantile = [&](double q) {
    double pos = q * static_cast<double>(sorted.size() - 1);
    size_t lo = static_cast<size_t>(pos);
    size_t hi = std::min(lo + 1, sorted.size() - 1);
    return sorted[lo] + (pos - static_cast<double>(lo)) * (sorted[hi] - sorted[lo]);
  };
  double q1 = quantile(0.25), q3 = quantile(0.75);
  double fence = q3 + 3 * (q3 - q1);
  for (double& v : y) v = std::min(v, fence);
}

class BayesianStrategy : public Strategy {
 public:
  BayesianStrategy(SearchSpace space, uint64_t seed) : space_(std::move(space)), seed_(seed) {}

  // Strategy
  std::optional<Assignment> Next(const std::vector<Observation>& observations, int trial_index) override {
    std::set<Assignment> seen = SeenSet(space_, observations);
    std::vector<std::vector<double>> done_x, pending_x;
    std::vector<double> done_y;
    for (const Observation& o : observations) {
      std::optional<std::vector<double>> x = space_.Encode(o.values);
      if (!x) continue;  // outside this space (a warm-start parent's other ranges)
      if (HasLoss(o)) {
        done_x.push_back(space_.Snap(*x));
        done_y.push_back(*o.loss);
      } else {
        pending_x.push_back(space_.Snap(*x));
      }
    }
    size_t d = space_.encoded_dimensions();
    size_t random_start = std::max<size_t>(3, std::min<size_t>(10, d + 1));
    if (done_y.size() < random_start) {
      Rng rng(StreamSeed(seed_, trial_index, kPurposeSample));
      return SampleFresh(space_, rng, seen);
    }
    Rng rng(StreamSeed(seed_, trial_index, kPurposeBayes));

    // A diverged trial (loss 1e10) would flatten everything else after standardising; losses above
    // the upper fence (third quartile + 3 interquartile ranges) are capped to it. Order is kept.
    CapOutliers(done_y);
    // Standardise with the completed losses only; the liars take the best of them.
    double mean = std::accumulate(done_y.begin(), done_y.end(), 0.0) / static_cast<double>(done_y.size());
    double var = 0;
    for (double y : done_y) var += (y - mean) * (y - mean);
    double sd = std::sqrt(var / static_cast<double>(done_y.size()));
    if (!(sd > 1e-12)) sd = 1.0;
    std::vector<double> z(done_y.size());
    for (size_t i = 0; i < z.size(); ++i) z[i] = (done_y[i] - mean) / sd;
    double best = *std::min_element(z.begin(), z.end());

    size_t params = space_.parameters().size();
    std::vector<size_t> fit_rows = Subset(z, 200, rng);
    std::vector<std::vector<double>> fit_x;
    std::vector<double> fit_y;
    for (size_t i : fit_rows) {
      fit_x.push_back(done_x[i]);
      fit_y.push_back(z[i]);
    }
    Kernel kernel = FitKernel(GpData(space_, std::move(fit_x), std::move(fit_y)), params);

    std::vector<size_t> rows = Subset(z, 500 - std::min<size_t>(pending_x.size(), 250), rng);
    std::vector<std::vector<double>> gp_x;
    std::vector<double> gp_y;
    for (size_t i : rows) {
      gp_x.push_back(done_x[i]);
      gp_y.push_back(z[i]);
    }
    // Running trials enter with a made-up loss (the liar): the model's own prediction there (the
    // "kriging believer"), but never better than the best observed loss, so that Expected
    // Improvement vanishes at and near them and proposals made while they run go elsewhere. On the
    // bench this needs far fewer trials than the plain CL-min lie (Hartmann-6 with 4 in flight:
    // median 35 trials against 66).
    std::vector<double> lies(pending_x.size(), best);
    if (!pending_x.empty()) {
      GpData completed(space_, gp_x, gp_y);
      GpModel believer(completed, kernel);
      for (size_t i = 0; i < pending_x.size(); ++i) {
        lies[i] = std::max(best, believer.Predict(space_, pending_x[i]).first);
      }
    }
    for (size_t i = 0; i < pending_x.size(); ++i) {
      gp_x.push_back(std::move(pending_x[i]));
      gp_y.push_back(lies[i]);
    }
    GpData data(space_, std::move(gp_x), std::move(gp_y));
    GpModel model(data, kernel);
    auto ei = [&](const std::vector<double>& x) {
      auto [m, s] = model.Predict(space_, x);
      return ExpectedImprovement(best, m, s);
    };

    // Candidates: uniform draws, and perturbations of the best observed points.
    std::vector<std::pair<double, std::vector<double>>> scored;
    size_t uniform = data.size() > 300 ? 1000 : 2000;
    for (size_t i = 0; i < uniform; ++i) {
      std::vector<double> x = SampleUnit(space_, rng);
      scored.emplace_back(ei(x), std::move(x));
    }
    std::vector<size_t> by_loss(z.size());
    std::iota(by_loss.begin(), by_loss.end(), 0);
    std::stable_sort(by_loss.begin(), by_loss.end(), [&](size_t a, size_t b) { return z[a] < z[b]; });
    for (size_t rank = 0; rank < std::min<size_t>(5, by_loss.size()); ++rank) {
      for (int i = 0; i < 60; ++i) {
        static constexpr double kScales[] = {0.01, 0.03, 0.1, 0.2};
        std::vector<double> x = Perturb(done_x[by_loss[rank]], kScales[i % 4], rng);
        scored.emplace_back(ei(x), std::move(x));
      }
    }
    // Local search from the best few candidates.
    std::sort(scored.begin(), scored.end(), [](const auto& a, const auto& b) { return a.first > b.first; });
    size_t starts = std::min<size_t>(5, scored.size());
    for (size_t s = 0; s < starts; ++s) {
      std::pair<double, std::vector<double>> current = scored[s];
      for (double scale : {0.05, 0.02, 0.005}) {
        for (int i = 0; i < 15; ++i) {
          std::vector<double> x = Perturb(current.second, scale, rng);
          double v = ei(x);
          if (v > current.first) current = {v, x};
          scored.emplace_back(v, std::move(x));
        }
      }
    }
    std::stable_sort(scored.begin(), scored.end(), [](const auto& a, const auto& b) { return a.first > b.first; });
    for (const auto& [value, x] : scored) {
      Assignment a = space_.Decode(x);
      if (!seen.count(a)) return a;
    }
    // Every candidate repeats an observed configuration (a small discrete space, nearly done).
    return SampleFresh(space_, rng, seen);
  }

 private:
  // A Gaussian step of `scale` on numeric coordinates; each categorical block is redrawn with
  // probability 0.2 (at least one block changes when there are no numeric parameters). Snapped.
  std::vector<double> Perturb(const std::vector<double>& from, double scale, Rng& rng) const {
    std::vector<double> x = from;
    const std::vector<Parameter>& params = space_.parameters();
    bool any_numeric = false;
    for (size_t i = 0; i < params.size(); ++i) {
      size_t at = space_.offset(i);
      if (params[i].kind == ParameterKind::kCategorical) {
        if (rng.Uniform() < 0.2) {
          size_t k = params[i].values.size();
          std::fill(x.begin() + static_cast<std::ptrdiff_t>(at), x.begin() + static_cast<std::ptrdiff_t>(at + k), 0.0);
          x[at + std::min(k - 1, static_cast<size_t>(rng.Uniform() * static_cast<double>(k)))] = 1.0;
        }
      } else {
        any_numeric = true;
        // Integers move at least a step often enough: the scale is in unit coordinates.
        x[at] = std::clamp(x[at] + scale * rng.Normal(), 0.0, 1.0);
      }
    }
    if (!any_numeric && !params.empty()) {
      size_t i = std::min(params.size() - 1, static_cast<size_t>(rng.Uniform() * static_cast<double>(params.size())));
      size_t at = space_.offset(i), k = params[i].values.size();
      std::fill(x.begin() + static_cast<std::ptrdiff_t>(at), x.begin() + static_cast<std::ptrdiff_t>(at + k), 0.0);
      x[at + std::min(k - 1, static_cast<size_t>(rng.Uniform() * static_cast<double>(k)))] = 1.0;
    }
    return space_.Snap(x);
  }

  SearchSpace space_;
  uint64_t seed_;
};

}  // namespace

Rng::Rng(uint64_t seed) {
  uint64_t state = seed;
  for (uint64_t& s : s_) s = SplitMix64(state);
}

uint64_t Rng::NextU64() {
  auto rotl = [](uint64_t x, int k) { return (x << k) | (x >> (64 - k)); };
  uint64_t result = rotl(s_[1] * 5, 7) * 9;
  uint64_t t = s_[1] << 17;
  s_[2] ^= s_[0];
  s_[3] ^= s_[1];
  s_[1] ^= s_[2];
  s_[0] ^= s_[3];
  s_[2] ^= t;
  s_[3] = rotl(s_[3], 45);
  return result;
}

double Rng::Uniform() { return static_cast<double>(NextU64() >> 11) * 0x1.0p-53; }

double Rng::Normal() {
  double u1 = Uniform(), u2 = Uniform();
  return std::sqrt(-2.0 * std::log1p(-u1)) * std::cos(2 * kPi * u2);  // 1 - u1 ∈ (0, 1]
}

Result<std::unique_ptr<Strategy>> MakeStrategy(std::string_view name, const SearchSpace& space, uint64_t seed) {
  std::unique_ptr<Strategy> strategy;
  if (name == "Random" || name == "Hyperband") {
    strategy = std::make_unique<RandomStrategy>(space, seed);
    return strategy;
  }
  if (name == "Bayesian") {
    strategy = std::make_unique<BayesianStrategy>(space, seed);
    return strategy;
  }
  if (name == "Grid") {
    if (!space.all_categorical()) {
      return Status::InvalidArgument(
          "Grid search supports only CategoricalParameterRanges; remove the integer and continuous ranges or "
          "choose another Strategy.");
    }
    strategy = std::make_unique<GridStrategy>(space);
    return strategy;
  }
  return Status::InvalidArgument("Strategy \"" + std::string(name) +
                                 "\" is not one of Bayesian, Random, Hyperband, Grid.");
}

}  // namespace kiln::control::tuning
