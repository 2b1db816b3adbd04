"""The genetic search and the ``swapadvisor`` planner (see the package docstring)."""
from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np

from simulator.api import Simulator
from simulator.plan import Plan
from simulator.profile.order import in_order

from ...core.api import simulator_for
from ...core.registry import DEFAULT_OPTIONS, Draft, Param, RunOptions, get_planner, register
from ...shared.polish import STAGES, polish_in_stages
from .evaluate import Evaluator
from .schedule import Dag, eager_order

ELITE = 2               # the best individuals pass to the next generation unchanged
CROSSOVER = 0.9         # the share of children made by crossover (the rest copy a parent)
SIGMA = 0.15            # a mutated gene moves by a normal step of this size
EVAL_SHARE = 0.5        # the share of the time limit the evaluation budget is planned for
# The cost model of decoding and scoring one chromosome, per decoder: (ms, us per op), about
# three times what one idle core takes (C decoder + C simulator: ~0.35 ms + ~0.9 us per op;
# the Python decoder: ~0.7 ms + ~13 us per op), so a slower or busy machine still finishes.
NOMINAL_COST = {"c": (0.3, 2.5), "python": (2.0, 40.0)}
DEFAULT_TIME_LIMIT = 60.0
SEEDS = "g10,capuchin,lms"
SEED_SHARE = 0.3        # once a seed is planned, no more seeds after this share of the time limit
# what the finished plan is polished by, stage after stage (planner/shared/polish.py): what the
# decoder cannot make (polish's shifts of single copies found nothing on its ResNet plans)
FINISH = STAGES[:2]


@dataclass
class Individual:
    order: np.ndarray
    genes: np.ndarray
    rank: tuple = ()
    born: int = 0                      # creation count: the tie-break, so ranks never tie

    def key(self) -> bytes:
        return self.order.tobytes() + self.genes.tobytes()


@dataclass
class Seed:
    """A greedy planner's draft, kept in the hall of fame as it is."""
    name: str
    draft: Draft
    rank: tuple


@dataclass
class History:
    best: list = field(default_factory=list)      # best feasible time per generation (None: none)
    mean: list = field(default_factory=list)      # mean feasible time per generation


def run_seeds(profile, hardware, budget: int, names: list[str], options: RunOptions,
              simulator: Simulator) -> tuple[list[Seed], dict]:
    """Each greedy planner's draft at its defaults, scored; failures are noted, not raised."""
    seeds, failed = [], {}
    started = time.perf_counter()
    for name in names:
        if seeds and options.past(started, SEED_SHARE):   # the time limit covers the seeds
            failed[name] = f"not planned: the seeds had used {SEED_SHARE:.0%} of the time limit"
            continue
        try:
            spec = get_planner(name)
            seeding = RunOptions(seed=options.seed, threads=1, simulator=simulator)
            draft = spec.func(profile, hardware, budget, options=seeding, **spec.resolve({}))
            plan = Plan(profile_name=profile.name, profile_sha256=simulator.compiled.sha256,
                        actions=tuple(draft.actions), initial=dict(draft.initial),
                        schedule=None if draft.schedule is None else tuple(draft.schedule))
            seeds.append(Seed(name, draft, simulator.score(plan, budget).rank()))
        except MemoryError:   # the machine's limit, not the seed's: the run stops (one line, exit 2)
            raise
        except Exception as exc:  # a seed that fails is left out; the search goes on
            failed[name] = f"{type(exc).__name__}: {exc}"[:200]
    return seeds, failed


def seed_genes(profile, draft: Draft) -> np.ndarray:
    """Genes leaning towards a seed's choices: evict what it moved, recompute what it
    recomputed, keep the rest."""
    index = {t.id: i for i, t in enumerate(profile.tensors)}
    genes = np.full((2, len(profile.tensors)), 0.5)
    genes[0, :] = 0.25
    for action in draft.actions:
        genes[0, index[action.tensor]] = 0.75
        if action.kind == "recompute":
            genes[1, index[action.tensor]] = 0.9
    for tid in draft.initial:
        genes[0, index[tid]] = 0.75
    return genes


class Search:
    """The GA: a population of (schedule, genes), tournament selection, the paper's
    crossover and mutation, elitism, early stop; all randomness from one seeded Generator."""

    def __init__(self, profile, evaluate: Evaluator, rng: np.random.Generator, population: int,
                 mutation_rate: float):
        self.profile, self.evaluate, self.rng = profile, evaluate, rng
        self.dag = Dag(profile)
        self.size, self.rate = population, mutation_rate
        self.cache: dict[bytes, tuple] = {}
        self.born = 0
        self.evaluations = 0

    def individual(self, order: np.ndarray, genes: np.ndarray) -> Individual:
        self.born += 1
        return Individual(order, np.clip(genes, 0.0, 1.0), born=self.born)

    def first(self, seeds: list[Seed]) -> list[Individual]:
        m, n = len(self.profile.tensors), len(self.profile.ops)
        identity = np.arange(n, dtype=np.int64)
        people = [self.individual(identity, np.full((2, m), 0.5))]
        people += [self.individual(identity, seed_genes(self.profile, s.draft)) for s in seeds]
        eager = eager_order(self.profile, self.dag)
        if not np.array_equal(eager, identity):
            people.append(self.individual(eager, np.full((2, m), 0.5)))
        while len(people) < self.size:
            base = identity if len(people) % 2 else eager
            order = self.mutate_order(base, moves=int(self.rng.poisson(2)))
            people.append(self.individual(order, 0.5 + self.rng.normal(0.0, SIGMA, (2, m))))
        return self.score(people[:self.size])

    def score(self, people: list[Individual]) -> list[Individual]:
        """Rank everyone not ranked yet (one batch; repeats come from the cache)."""
        todo, keys = [], []
        for person in people:
            key = person.key()
            if key in self.cache:
                person.rank = self.cache[key]
            elif key not in keys:
                keys.append(key)
                todo.append(person)
        ranks = self.evaluate([(p.order, p.genes) for p in todo])
        self.evaluations += len(todo)
        for key, rank in zip(keys, ranks):
            self.cache[key] = rank
        for person in people:
            person.rank = self.cache[person.key()]
        return sorted(people, key=lambda p: (p.rank, p.born))

    def mutate_order(self, order: np.ndarray, moves: int) -> np.ndarray:
        for _ in range(moves):
            order = self.dag.mutate(order, self.rng)
        return order

    def pick(self, people: list[Individual]) -> Individual:
        """Tournament of two (the list is sorted best first)."""
        i, j = self.rng.integers(len(people), size=2)
        return people[min(i, j)]

    def next(self, people: list[Individual]) -> list[Individual]:
        rng, children = self.rng, []
        while len(children) < self.size - ELITE:
            mother, father = self.pick(people), self.pick(people)
            if rng.random() < CROSSOVER:
                order = self.dag.crossover(mother.order, father.order, rng)
                genes = np.where(rng.random(mother.genes.shape) < 0.5, mother.genes, father.genes)
            else:
                order, genes = mother.order, mother.genes.copy()
            hit = rng.random(genes.shape) < self.rate
            genes[hit] += rng.normal(0.0, SIGMA, int(hit.sum()))
            order = self.mutate_order(order, int(rng.poisson(10 * self.rate)))
            children.append(self.individual(order, genes))
        return self.score(people[:ELITE] + children)


def evaluation_budget(time_limit: float, ops: int, population: int, decoder: str = "c") -> int:
    """How many chromosomes the search may score: the time limit turned into a count by
    the decoder's fixed cost model, so that where the search stops never depends on the
    machine (only on whether the C decoder is built)."""
    ms, us_per_op = NOMINAL_COST[decoder]
    return max(population, int(EVAL_SHARE * time_limit * 1e3 / (ms + us_per_op * ops / 1e3)))


def describe(rank: tuple) -> str:
    if not rank:
        return "none"
    if rank[0] == 0:
        return f"{rank[1]:,.0f} us"
    return f"{rank[1]:,} B over budget" if rank[0] == 1 else "invalid"


def plot_history(history: History, path: str, title: str) -> None:
    """Best and mean feasible iteration time per generation, as a PNG."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(7, 4))
    gens = range(len(history.best))
    ax.plot(gens, [np.nan if v is None else v / 1e3 for v in history.best], label="best")
    ax.plot(gens, [np.nan if v is None else v / 1e3 for v in history.mean], label="mean")
    ax.set_xlabel("generation")
    ax.set_ylabel("iteration time (ms)")
    ax.set_title(title)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


@register(
    "swapadvisor",
    "SwapAdvisor (ASPLOS'20): a genetic search over op schedules and per-tensor swap genes, decoded by "
    "Belady eviction with early prefetch (and recompute), scored by simulation; seeded with the greedy plans.",
    params=(
        Param("population", 32, "individuals per generation", low=4, high=4096),
        Param("generations", 200, "at most this many generations", low=0, high=100000),
        Param("mutation_rate", 0.1, "the chance each gene is perturbed; a child's schedule gets "
                                    "Poisson(10 x rate) op moves", low=0.0, high=1.0),
        Param("patience", 20, "stop after this many generations without improvement", low=1, high=100000),
        Param("jobs", 1, "score in this many local processes", low=1, high=256),
        Param("dask", "", "score on the Dask scheduler at this address (tcp://host:port)"),
        Param("plot", "", "write a convergence plot (best and mean per generation) to this PNG"),
        Param("seeds", SEEDS, "greedy planners whose plans seed the search (comma-separated)"),
    ),
    moves_persistent=True,
    recomputes=True,
    paper="Huang, Jin, Li: SwapAdvisor: Pushing Deep Learning Beyond the GPU Memory Limit via Smart Swapping, "
          "ASPLOS 2020",
    searches=True, family="swap + recompute",
)
def plan_swapadvisor(profile, hardware, budget_bytes, *, options=DEFAULT_OPTIONS, population=32, generations=200,
                     mutation_rate=0.1, patience=20, jobs=1, dask="", plot="", seeds=SEEDS):
    started = time.perf_counter()
    limit = options.time_limit if options.time_limit is not None else DEFAULT_TIME_LIMIT
    budget = int(budget_bytes)
    evaluate = Evaluator(profile, hardware, budget, jobs, dask, simulator_for(profile, hardware, options))
    try:
        names = [name.strip() for name in seeds.split(",") if name.strip()]
        hall, failed = run_seeds(profile, hardware, budget, names, options, evaluate.local.simulator)
        search = Search(profile, evaluate, np.random.default_rng(options.seed), population, mutation_rate)
        searching = time.perf_counter()
        decoder = "c" if evaluate.local.decoder.fast else "python"
        allowed = evaluation_budget(limit, len(profile.ops), population, decoder)
        people = search.first(hall)
        history = History()
        best, stale, generation, stop = people[0], 0, 0, "generations"
        log(options, history, people, 0, generations, search, searching)
        ideal = (0, profile.ideal_us + 1e-6)   # no plan runs faster than its ops (R3: rounded)
        while True:
            if generation >= generations:
                break
            if min([best.rank] + [s.rank for s in hall]) <= ideal:
                stop = "ideal time reached"
                break
            if stale >= patience:
                stop = "patience"
                break
            if search.evaluations + population - ELITE > allowed:
                stop = "evaluation budget (time limit)"
                break
            if time.perf_counter() - started > limit:
                stop = "wall clock (time limit): cut where the machine was, so not reproducible"
                break
            people = search.next(people)
            generation += 1
            if people[0].rank < best.rank:
                best, stale = people[0], 0
            else:
                stale += 1
            log(options, history, people, generation, generations, search, searching)
        seconds = time.perf_counter() - searching
        if plot:
            plot_history(history, plot, f"swapadvisor: {profile.name}, {budget / 2**30:.2f} GiB")
    finally:
        evaluate.close()
    top_seed = min(hall, key=lambda s: s.rank) if hall else None
    improved = top_seed is None or best.rank < top_seed.rank
    if improved:
        decoded = evaluate.local.decoder.decode(best.order, best.genes)
        draft = Draft(actions=decoded.actions, schedule=decoded.schedule, initial=decoded.initial)
        counts = {"swaps": decoded.swaps, "recomputes": decoded.recomputes}
    else:
        draft = Draft(actions=list(top_seed.draft.actions), schedule=top_seed.draft.schedule,
                      initial=dict(top_seed.draft.initial), status=top_seed.draft.status,
                      estimate_us=top_seed.draft.estimate_us)
        counts = {}
    winner = best.rank if improved else top_seed.rank
    finished = finish(profile, hardware, budget, draft, evaluate.local.simulator, started + limit)
    options.say(f"swapadvisor: {generation} generations, {search.evaluations} evaluations in {seconds:.1f} s "
                f"({search.evaluations / max(seconds, 1e-9):.0f}/s), stopped by {stop}; best {describe(winner)} "
                f"({'the search' if improved else 'seed ' + top_seed.name})")
    draft.notes = {
        "generations": generation, "evaluations": search.evaluations, "evaluation_budget": allowed,
        "decoder": decoder,
        "stop": stop, "best_seed": top_seed.name if top_seed else None,
        "seeds": {s.name: describe(s.rank) for s in hall}, "seed_failures": failed,
        "improved_over_seeds": bool(improved and top_seed is not None),
        "reordered": draft.schedule is not None, "best_search": describe(best.rank), **counts,
    }
    if finished is not None:
        draft.actions, draft.initial = finished.actions, finished.initial
        draft.notes["polish"] = {"changes": finished.changes, "simulations": finished.runs,
                                 "before": describe(winner)}
        options.say(f"swapadvisor: polish kept {finished.changes} changes in {finished.runs} simulations: "
                    f"{finished.result.iteration_us:,.0f} us")
    return draft


def finish(profile, hardware, budget: int, draft: Draft, simulator: Simulator, deadline: float):
    """The chosen plan polished by the stages of ``FINISH`` until ``deadline``, in the
    plan's own order (None when nothing changed): what the decoder does not make itself.
    The input's copy out begun at the start, while the first op reads it; weights started
    in host memory; a tensor kept only as a recompute's source recomputed too, a dearer
    recompute given up for the room; recomputes made swaps where the up link has room
    (ResNet-50 b1024 at 30%: 2.653 -> 2.617 s; ResNet-152 b512: 3.441 -> 3.419 s)."""
    if not draft.actions or time.perf_counter() >= deadline:
        return None
    if draft.schedule is not None:
        simulator = Simulator(in_order(profile, draft.schedule), hardware)
    done = polish_in_stages(simulator, budget, draft.actions, draft.initial, deadline, stages=FINISH)
    return done if done.changes else None


def log(options: RunOptions, history: History, people: list[Individual], generation: int, generations: int,
        search: Search, started: float) -> None:
    """One progress line per generation, and the history for the plot."""
    times = [p.rank[1] for p in people if p.rank[0] == 0]
    history.best.append(min(times) if times else None)
    history.mean.append(sum(times) / len(times) if times else None)
    mean = f"{history.mean[-1]:,.0f} us" if times else "none feasible"
    rate = search.evaluations / max(time.perf_counter() - started, 1e-9)
    options.say(f"swapadvisor generation {generation}/{generations}: best {describe(people[0].rank)}, "
                f"mean {mean}, {rate:.0f} evaluations/s")
