// The block-level DFS's hot loop (see block_dfs.h for the contract with Python).
#include "block_dfs.h"

#include <pybind11/stl.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cstdint>
#include <stdexcept>
#include <unordered_map>
#include <utility>
#include <vector>

namespace py = pybind11;

namespace mirage_jax::search {
namespace {

constexpr int kMaxRank = 8;
constexpr int kNoFit = -2;  // fit(): the value cannot be this output
constexpr int kUnknown = -3;  // fit cache: not asked yet
enum Phase { kInv = 0, kBody = 1, kEpi = 2 };
// the counters an evaluate() drop may name (the order of Counters in native.py)
enum Counter { kAccepted = 0, kAbstract, kIndex, kDuplicate, kNumeric, kNumCounters };

struct Shape {
  int rank = 0;
  std::array<int64_t, kMaxRank> d{};
  bool operator==(const Shape& o) const {
    if (rank != o.rank) return false;
    for (int i = 0; i < rank; ++i)
      if (d[i] != o.d[i]) return false;
    return true;
  }
};

Shape ToShape(const std::vector<int64_t>& v) {
  if (v.size() > kMaxRank) throw std::invalid_argument("block DFS: rank above 8");
  Shape s;
  s.rank = static_cast<int>(v.size());
  for (int i = 0; i < s.rank; ++i) s.d[i] = v[i];
  return s;
}

py::tuple ToTuple(const Shape& s) {
  py::tuple t(s.rank);
  for (int i = 0; i < s.rank; ++i) t[i] = s.d[i];
  return t;
}

// the shape rules of rules.py; false: the op does not apply
bool Bcast(const Shape& a, const Shape& b, Shape* out) {
  if (a.rank != b.rank) return false;
  out->rank = a.rank;
  for (int i = 0; i < a.rank; ++i) {
    if (a.d[i] == b.d[i] || b.d[i] == 1) {
      out->d[i] = a.d[i];
    } else if (a.d[i] == 1) {
      out->d[i] = b.d[i];
    } else {
      return false;
    }
  }
  return true;
}

bool MatmulShape(const Shape& a, const Shape& b, Shape* out) {
  int r = a.rank;
  if (r < 2 || r != b.rank || a.d[r - 1] != b.d[r - 2]) return false;
  for (int i = 0; i < r - 2; ++i)
    if (a.d[i] != b.d[i]) return false;
  *out = a;
  out->d[r - 1] = b.d[r - 1];
  return true;
}

Shape Reduced(const Shape& a, int dim) {
  Shape s = a;
  s.d[dim] = 1;
  return s;
}

bool ConcatShape(const Shape& a, const Shape& b, int dim, Shape* out) {
  if (a.rank != b.rank) return false;
  for (int i = 0; i < a.rank; ++i)
    if (i != dim && a.d[i] != b.d[i]) return false;
  *out = a;
  out->d[dim] = a.d[dim] + b.d[dim];
  return true;
}

// The canonical-order key (stage, op rank, attribute rank, operands), compared
// lexicographically as Python compares the tuples. An input iterator's key is (-1,): stage -1;
// a macro's last op has (stage, -1): op -1.
struct Key {
  int st = -1, op = -1, attr = -1, in0 = -1, in1 = -1;
  bool operator>(const Key& o) const {
    if (st != o.st) return st > o.st;
    if (op != o.op) return op > o.op;
    if (attr != o.attr) return attr > o.attr;
    if (in0 != o.in0) return in0 > o.in0;
    return in1 > o.in1;
  }
};

struct Node {
  int op, attr, in0, in1;  // in1 = -1 for unary ops
  Key key;
};

struct Eval {
  int kind, sid, sig;
};

// A proposed op that passed evaluate(): a move of the partial graph where it was proposed and
// of every graph below it (its checks read only its operands). ``rank`` is its place in the
// order Python's generators propose moves in (block_moves.py); lists are kept in that order.
struct Move {
  uint64_t rank;
  Key key;
  int op, attr, in0, in1;
  Eval ev;
};

struct MemoKey {
  int op, attr, s0, s1, st;
  bool operator==(const MemoKey& o) const {
    return op == o.op && attr == o.attr && s0 == o.s0 && s1 == o.s1 && st == o.st;
  }
};

struct MemoHash {
  size_t operator()(const MemoKey& k) const {
    uint64_t h = static_cast<uint32_t>(k.s0) * 0x9E3779B97F4A7C15ull;
    h ^= (static_cast<uint64_t>(static_cast<uint32_t>(k.s1)) + 0x632BE59BD9B4E019ull) * 0xBF58476D1CE4E5B9ull;
    h ^= (static_cast<uint64_t>(k.op) << 40) ^ (static_cast<uint64_t>(k.attr) << 20) ^ k.st;
    h ^= h >> 29;
    return static_cast<size_t>(h * 0x94D049BB133111EBull);
  }
};

struct StopSearch {};

class BlockSearch {
 public:
  BlockSearch(py::dict spec, py::function evaluate, py::function fit)
      : evaluate_(std::move(evaluate)), fit_(std::move(fit)) {
    for (auto item : spec["unary"].cast<py::list>()) {
      auto pair = item.cast<std::pair<int, std::vector<int>>>();
      unary_.push_back(pair);
    }
    reduce_ = spec["reduce"].cast<std::vector<int>>();
    for (auto item : spec["binary"].cast<py::list>()) {
      auto t = item.cast<py::tuple>();
      binary_.push_back({t[0].cast<int>(), t[1].cast<std::vector<int>>(), t[2].cast<bool>(),
                         t[3].cast<bool>()});
    }
    matmul_ = spec["matmul"].cast<int>();
    concat_ = spec["concat"].cast<int>();
    for (auto item : spec["acc"].cast<py::list>()) {
      auto t = item.cast<py::tuple>();
      acc_.push_back({t[0].cast<int>(), t[1].cast<bool>()});
    }
    dim_attr_ = spec["dim_attr"].cast<std::vector<int>>();  // index d + 1, d = -1 .. 7
    n_attrs_ = spec["n_attrs"].cast<int>();
    empty_attr_ = spec["empty_attr"].cast<int>();
    for (auto item : spec["attr_rank"].cast<py::list>()) {
      auto t = item.cast<std::tuple<int, int, int>>();
      SetRank(std::get<0>(t), std::get<1>(t), std::get<2>(t));
    }
    max_ops_ = spec["max_ops"].cast<int>();
    outputs_ = spec["outputs"].cast<int>();
    loops_ = spec["loops"].cast<int>();
    max_states_ = spec["max_states"].cast<int64_t>();
    deadline_ = spec["deadline"].cast<double>();
    prune_ = spec["prune"].cast<bool>();
  }

  // Identities the Python side interned before the search (the operands and seeds).
  void AddSid(int sid, std::vector<int64_t> shape, int phase, int sig) {
    Register(sid, ToShape(shape), phase, sig);
  }

  // The initial partial graph: one entry per value (its node: op, attr, ins, key).
  void Push(int sid, int op, int attr, std::vector<int> ins, std::vector<int> key, bool sealed) {
    Node n{op, attr, ins.size() > 0 ? ins[0] : -1, ins.size() > 1 ? ins[1] : -1, Key{}};
    int* k[] = {&n.key.st, &n.key.op, &n.key.attr, &n.key.in0, &n.key.in1};
    for (size_t i = 0; i < key.size() && i < 5; ++i) *k[i] = key[i];
    bool iter = key.size() == 1 && key[0] == -1;
    PushValue(sid, n, sealed, iter);
  }

  // Runs the DFS from the initial graph (pushed so far); what it found is in found().
  void Run(int stage) {
    first_new_ = nodes_.size();
    // sized once: a level's moves stay put while the levels below it run
    moves_.resize(first_new_ + max_ops_ + 1);
    applied_.resize(first_new_ + max_ops_ + 1);
    try {
      Dfs(stage);
    } catch (StopSearch&) {
      truncated_ = true;
    }
  }

  py::dict Counters() const {
    py::dict d;
    d["states"] = states_;
    d["proposed"] = counts_[kAccepted];
    d["pruned_abstract"] = counts_[kAbstract];
    d["pruned_index"] = counts_[kIndex];
    d["pruned_duplicate"] = counts_[kDuplicate] + duplicates_;
    d["pruned_numeric"] = counts_[kNumeric];
    d["pruned_dead"] = dead_;
    d["truncated"] = truncated_;
    d["timed_out"] = timed_out_;
    return d;
  }

  // (nodes added by the DFS as (op, attr, ins), savers as (value, fdim)) per skeleton
  const std::vector<std::pair<std::vector<std::tuple<int, int, std::vector<int>>>,
                              std::vector<std::pair<int, int>>>>&
  Found() const {
    return found_;
  }

 private:
  struct Bin {
    int op;
    std::vector<int> attrs;
    bool comm, trivial;
  };
  struct Acc {
    int op;
    bool rescale;
  };
  struct SidInfo {
    Shape shape;
    int phase = -1, sig = -1;
  };

  void SetRank(int op, int attr, int rank) {
    size_t at = static_cast<size_t>(op) * n_attrs_ + attr;
    if (attr_rank_.size() <= at) attr_rank_.resize(at + 1, -1);
    attr_rank_[at] = rank;
  }
  int Rank(int op, int attr) const {
    size_t at = static_cast<size_t>(op) * n_attrs_ + attr;
    if (at >= attr_rank_.size() || attr_rank_[at] < 0)
      throw std::logic_error("block DFS: an attribute without a rank");
    return attr_rank_[at];
  }

  // sids are a search's (shared by its tasks, see SearchShare): sparse here, so maps
  void Register(int sid, const Shape& s, int phase, int sig) {
    if (sid < 0) throw std::logic_error("block DFS: negative sid");
    sids_.try_emplace(sid, SidInfo{s, phase, sig});
  }

  void PushValue(int sid, const Node& n, bool sealed, bool iter) {
    const SidInfo* info = &sids_.at(sid);  // map nodes stay put: the pointer is stable
    vsid_.push_back(sid);
    vinfo_.push_back(info);
    uses_.push_back(0);
    sealed_.push_back(sealed);
    nodes_.push_back(n);
    ++sig_count_[info->sig];
    if (n.in0 >= 0) ++uses_[n.in0];
    if (n.in1 >= 0) ++uses_[n.in1];
    if (!iter) ++n_ops_;
    iter_.push_back(iter);
  }

  void PopValue() {
    const Node& n = nodes_.back();
    if (n.in0 >= 0) --uses_[n.in0];
    if (n.in1 >= 0) --uses_[n.in1];
    --sig_count_[vinfo_.back()->sig];
    if (!iter_.back()) --n_ops_;
    vsid_.pop_back();
    vinfo_.pop_back();
    uses_.pop_back();
    sealed_.pop_back();
    nodes_.pop_back();
    iter_.pop_back();
  }

  int Phase(int v) const { return vinfo_[v]->phase; }
  const Shape& ShapeOf(int v) const { return vinfo_[v]->shape; }

  void Tick() {
    ++states_;
    if (states_ > max_states_) throw StopSearch{};
    if (deadline_ > 0 && states_ % 256 == 0) {
      double now = std::chrono::duration<double>(
                       std::chrono::system_clock::now().time_since_epoch())
                       .count();
      if (now > deadline_) {
        timed_out_ = true;
        throw StopSearch{};
      }
    }
  }

  // The moves of a partial graph are its parent's (all but the one applied, of a stage not
  // below it) and the new ones on the value just made: a move rejected once is not proposed
  // again, and only the new ones are evaluated (and counted).
  void Dfs(int stage) {
    Tick();
    if (n_ops_ != 0) Complete();
    if (n_ops_ >= max_ops_) return;
    size_t depth = nodes_.size();
    std::vector<Move>& here = moves_[depth];
    here.clear();
    if (depth == first_new_) {
      Propose(stage, -1, &here);
    } else {
      fresh_.clear();
      Propose(stage, static_cast<int>(depth) - 1, &fresh_);
      const Move& applied = *applied_[depth - 1];
      Merge(moves_[depth - 1], applied, stage, &here);
    }
    bool iter = iter_.back();
    Key last_key = iter ? Key{} : nodes_.back().key;
    int last_out = iter ? -1 : static_cast<int>(depth) - 1;
    for (size_t k = 0; k < moves_[depth].size(); ++k) {
      const Move& mv = moves_[depth][k];  // deeper levels only touch their own lists
      if (!(mv.key > last_key || mv.in0 == last_out || mv.in1 == last_out)) continue;
      auto seen = sig_count_.find(mv.ev.sig);
      if (prune_ && seen != sig_count_.end() && seen->second > 0) {
        ++duplicates_;
        continue;
      }
      applied_[depth] = &mv;
      PushValue(mv.ev.sid, Node{mv.op, mv.attr, mv.in0, mv.in1, mv.key}, false, false);
      if (CanFinish(mv.key.st)) {
        Dfs(mv.key.st);
      } else {
        ++dead_;
      }
      PopValue();
    }
  }

  // here = the parent's moves but ``applied`` and those of a stage below ``stage``, merged in
  // rank order with fresh_ (the moves on the new value)
  void Merge(const std::vector<Move>& parent, const Move& applied, int stage,
             std::vector<Move>* here) {
    auto next = fresh_.begin();
    for (const Move& mv : parent) {
      if (&mv == &applied || mv.key.st < stage) continue;
      while (next != fresh_.end() && next->rank < mv.rank) here->push_back(*next++);
      here->push_back(mv);
    }
    here->insert(here->end(), next, fresh_.end());
  }

  bool CanFinish(int stage) const {
    int dangling = 0, dead = 0;
    for (size_t v = 0; v < uses_.size(); ++v) {
      if (uses_[v] == 0) {
        ++dangling;
        if (Phase(static_cast<int>(v)) == kBody) ++dead;
      }
    }
    if (dangling - (max_ops_ - n_ops_) > outputs_) return false;
    if (stage >= 3 && dead > outputs_) return false;
    return true;
  }

  Eval Evaluate(int op, int attr, int in0, int in1, int st, const Shape& shape) {
    MemoKey key{op, attr, vsid_[in0], in1 >= 0 ? vsid_[in1] : -1, st};
    auto it = memo_.find(key);
    if (it == memo_.end()) {
      py::tuple sids = in1 >= 0 ? py::tuple(py::make_tuple(key.s0, key.s1))
                                : py::tuple(py::make_tuple(key.s0));
      auto res = evaluate_(op, attr, sids, st, ToTuple(shape)).cast<py::tuple>();
      Eval ev{res[0].cast<int>(), res[1].cast<int>(), res[2].cast<int>()};
      if (ev.kind < 0 || ev.kind >= kNumCounters)
        throw std::logic_error("block DFS: evaluate returned an unknown counter");
      if (ev.kind == kAccepted) {
        static const int kPhaseOfStage[] = {kInv, kBody, kEpi, kEpi};
        Register(ev.sid, shape, kPhaseOfStage[st], ev.sig);
      }
      it = memo_.emplace(key, ev).first;
    }
    ++counts_[it->second.kind];
    return it->second;
  }

  // -- moves (block_moves.py) ---------------------------------------------------------------
  // The moves of stage >= ``stage`` on value ``only`` (all moves when -1), evaluated, the
  // accepted ones appended to ``out`` in Python's proposal order.
  void Propose(int stage, int only, std::vector<Move>* out) {
    inv_.clear();
    body_.clear();
    epi_.clear();
    for (int v = 0; v < static_cast<int>(vsid_.size()); ++v) {
      int p = Phase(v);
      if (p == kInv && !sealed_[v]) inv_.push_back(v);
      if (p == kBody && !sealed_[v]) body_.push_back(v);
      if (p == kEpi) epi_.push_back(v);
    }
    out_ = out;
    only_ = only;
    if (stage <= 0) Compute(0, inv_, inv_);
    if (stage <= 1 && !body_.empty()) {
      pool_ = inv_;
      pool_.insert(pool_.end(), body_.begin(), body_.end());
      Compute(1, pool_, body_);
    }
    if (stage <= 2 && !body_.empty() && loops_ > 1) Accumulators(body_);
    if (!epi_.empty()) {
      pool_ = inv_;
      pool_.insert(pool_.end(), epi_.begin(), epi_.end());
      Compute(3, pool_, epi_);
    }
  }

  // A value's place in an operand pool: loop-invariant values first, then by id.
  uint64_t Pos(int v) const { return (Phase(v) != kInv ? uint64_t{1} << 13 : 0) | v; }

  // rank fields: stage, generator, op (its index in the generator's list), operands, attribute
  static uint64_t RankOf(int st, int gen, int op, uint64_t a, uint64_t b, int attr) {
    return static_cast<uint64_t>(st) << 61 | static_cast<uint64_t>(gen) << 58 |
           static_cast<uint64_t>(op) << 50 | a << 36 | b << 22 | static_cast<uint64_t>(attr);
  }

  void Emit(int st, uint64_t rank, int op, int attr, int in0, int in1, const Shape& s) {
    if (only_ < 0)  // the first graph: an op its seeds applied is no move (Python's ``sigs``)
      for (const Node& n : nodes_)
        if (n.op == op && n.attr == attr && n.in0 == in0 && n.in1 == in1) return;
    Move mv{rank, Key{st, op, Rank(op, attr), in0, in1}, op, attr, in0, in1, {}};
    mv.ev = Evaluate(op, attr, in0, in1, st, s);
    if (mv.ev.kind == kAccepted) out_->push_back(mv);
  }

  // the operand pairs of ``pool`` x ``pool`` a binary generator visits, in its order: all of
  // them, or those on only_
  template <typename F>
  void Pairs(const std::vector<int>& pool, F&& visit) {
    if (only_ < 0) {
      for (int u : pool)
        for (int v : pool) visit(u, v);
      return;
    }
    if (std::find(pool.begin(), pool.end(), only_) == pool.end()) return;
    for (int u : pool) {
      if (u != only_) {
        visit(u, only_);
      } else {
        for (int v : pool) visit(u, v);
      }
    }
  }

  bool Wanted(int v) const { return only_ < 0 || v == only_; }

  void Compute(int st, const std::vector<int>& pool, const std::vector<int>& must) {
    member_.assign(vsid_.size(), false);
    for (int v : must) member_[v] = true;
    for (size_t k = 0; k < unary_.size(); ++k) {
      const auto& [op, attrs] = unary_[k];
      for (int v : must)
        if (Wanted(v))
          for (size_t a = 0; a < attrs.size(); ++a)
            Emit(st, RankOf(st, 0, k, Pos(v), 0, a), op, attrs[a], v, -1, ShapeOf(v));
    }
    for (size_t k = 0; k < reduce_.size(); ++k)
      for (int v : must) {
        if (!Wanted(v)) continue;
        const Shape& s = ShapeOf(v);
        for (int d = 0; d < s.rank; ++d)
          if (s.d[d] > 1)
            Emit(st, RankOf(st, 1, k, Pos(v), 0, d), reduce_[k], dim_attr_[d + 1], v, -1,
                 Reduced(s, d));
      }
    Shape r;
    for (size_t k = 0; k < binary_.size(); ++k) {
      const Bin& b = binary_[k];
      Pairs(pool, [&](int u, int v) {
        if ((b.comm && u > v) || (u == v && b.trivial)) return;
        if (!member_[u] && !member_[v]) return;
        if (Bcast(ShapeOf(u), ShapeOf(v), &r))
          for (size_t a = 0; a < b.attrs.size(); ++a)
            Emit(st, RankOf(st, 2, k, Pos(u), Pos(v), a), b.op, b.attrs[a], u, v, r);
      });
    }
    if (matmul_ >= 0)
      Pairs(pool, [&](int u, int v) {
        if (!member_[u] && !member_[v]) return;
        if (MatmulShape(ShapeOf(u), ShapeOf(v), &r))
          Emit(st, RankOf(st, 3, 0, Pos(u), Pos(v), 0), matmul_, empty_attr_, u, v, r);
      });
    if (concat_ >= 0)
      Pairs(pool, [&](int u, int v) {
        if (u == v || (!member_[u] && !member_[v])) return;
        for (int d = 0; d < ShapeOf(u).rank; ++d)
          if (ConcatShape(ShapeOf(u), ShapeOf(v), d, &r))
            Emit(st, RankOf(st, 4, 0, Pos(u), Pos(v), d), concat_, dim_attr_[d + 1], u, v, r);
      });
  }

  void Accumulators(const std::vector<int>& body) {
    for (size_t k = 0; k < acc_.size(); ++k) {
      const Acc& acc = acc_[k];
      if (acc.rescale) {
        Pairs(body, [&](int x, int m) {
          Shape r;
          if (x != m && Bcast(ShapeOf(x), ShapeOf(m), &r) && r == ShapeOf(x))
            Emit(2, RankOf(2, 0, k, Pos(x), Pos(m), 0), acc.op, empty_attr_, x, m, ShapeOf(x));
        });
        continue;
      }
      for (int v : body) {
        if (!Wanted(v)) continue;
        const Shape& s = ShapeOf(v);
        Emit(2, RankOf(2, 0, k, Pos(v), 0, 0), acc.op, dim_attr_[0], v, -1, s);
        for (int d = 0; d < s.rank; ++d)
          if (s.d[d] > 1)
            Emit(2, RankOf(2, 0, k, Pos(v), 0, d + 1), acc.op, dim_attr_[d + 1], v, -1,
                 Reduced(s, d));
      }
    }
  }

  // -- completion (saving.py) ------------------------------------------------------------------
  int Fit(int v, int i) {
    int sid = vsid_[v];
    auto [slot, fresh] = fits_.try_emplace(static_cast<int64_t>(sid) * outputs_ + i, kUnknown);
    if (fresh) {
      py::object r = fit_(sid, i);
      slot->second = r.is_none() ? kNoFit : r.cast<int>();
    }
    return slot->second;
  }

  void Complete() {
    dangling_.clear();
    for (int v = 0; v < static_cast<int>(uses_.size()); ++v)
      if (uses_[v] == 0) dangling_.push_back(v);
    if (static_cast<int>(dangling_.size()) > outputs_) return;
    options_.assign(outputs_, {});
    for (int i = 0; i < outputs_; ++i) {
      for (int v = 0; v < static_cast<int>(vsid_.size()); ++v) {
        int f = Fit(v, i);
        if (f != kNoFit) options_[i].push_back({v, f});
      }
      if (options_[i].empty()) return;
    }
    std::vector<size_t> at(outputs_, 0);
    while (true) {  // the product of the options, last output fastest (itertools.product)
      bool all_saved = true;
      for (int v : dangling_) {
        bool saved = false;
        for (int i = 0; i < outputs_ && !saved; ++i) saved = options_[i][at[i]].first == v;
        all_saved = all_saved && saved;
      }
      if (all_saved) Record(at);
      int i = outputs_ - 1;
      while (i >= 0 && ++at[i] == options_[i].size()) at[i--] = 0;
      if (i < 0) break;
    }
  }

  void Record(const std::vector<size_t>& at) {
    std::vector<std::tuple<int, int, std::vector<int>>> nodes;
    for (size_t k = first_new_; k < nodes_.size(); ++k) {
      const Node& n = nodes_[k];
      std::vector<int> ins{n.in0};
      if (n.in1 >= 0) ins.push_back(n.in1);
      nodes.emplace_back(n.op, n.attr, std::move(ins));
    }
    std::vector<std::pair<int, int>> savers;
    for (int i = 0; i < outputs_; ++i) savers.push_back(options_[i][at[i]]);
    found_.emplace_back(std::move(nodes), std::move(savers));
  }

  py::function evaluate_, fit_;
  std::vector<std::pair<int, std::vector<int>>> unary_;
  std::vector<int> reduce_;
  std::vector<Bin> binary_;
  int matmul_ = -1, concat_ = -1;
  std::vector<Acc> acc_;
  std::vector<int> dim_attr_, attr_rank_;
  int n_attrs_ = 0, empty_attr_ = 0, max_ops_ = 0, outputs_ = 0, loops_ = 1;
  int64_t max_states_ = 0;
  double deadline_ = 0;
  bool prune_ = true;

  std::unordered_map<int, SidInfo> sids_;
  std::unordered_map<int64_t, int> fits_;
  std::unordered_map<int, int> sig_count_;
  std::unordered_map<MemoKey, Eval, MemoHash> memo_;

  // the partial graph: per value its sid, uses, sealed flag, node
  std::vector<int> vsid_, uses_;
  std::vector<const SidInfo*> vinfo_;
  std::vector<bool> sealed_, iter_;
  std::vector<Node> nodes_;
  int n_ops_ = 0;
  size_t first_new_ = 0;

  // scratch
  std::vector<std::vector<Move>> moves_;  // per depth: the moves of the graph there
  std::vector<const Move*> applied_;  // per depth: the move applied below it
  std::vector<Move> fresh_;
  std::vector<Move>* out_ = nullptr;
  int only_ = -1;
  std::vector<int> inv_, body_, epi_, pool_, dangling_;
  std::vector<bool> member_;
  std::vector<std::vector<std::pair<int, int>>> options_;

  int64_t states_ = 0, dead_ = 0, duplicates_ = 0;
  std::array<int64_t, kNumCounters> counts_{};
  bool truncated_ = false, timed_out_ = false;
  std::vector<std::pair<std::vector<std::tuple<int, int, std::vector<int>>>,
                        std::vector<std::pair<int, int>>>>
      found_;
};

}  // namespace

void BindBlockSearch(py::module_& m) {
  py::class_<BlockSearch>(m, "BlockSearch",
                          "The block-level DFS of one task (mirage_jax.search.enumeration"
                          ".native drives it).")
      .def(py::init<py::dict, py::function, py::function>(), py::arg("spec"),
           py::arg("evaluate"), py::arg("fit"))
      .def("add_sid", &BlockSearch::AddSid)
      .def("push", &BlockSearch::Push)
      .def("run", &BlockSearch::Run)
      .def("counters", &BlockSearch::Counters)
      .def("found", &BlockSearch::Found);
}

}  // namespace mirage_jax::search
