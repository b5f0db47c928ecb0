/*****************************************************************************\
 *  test_k8s_calc.c - table-driven tests of the pure k8s calculation.
 *  Built and run by "make check" (under valgrind with "make check VALGRIND=1").
\*****************************************************************************/

#include <stdio.h>
#include <string.h>

#include <slurm/slurm.h>

#include "k8s_calc.h"

/* REQ() starts from "nothing set" and lets each case override a few fields. */
#pragma GCC diagnostic ignored "-Woverride-init"
#pragma GCC diagnostic ignored "-Wmissing-field-initializers"

#define REQ(...) ((k8s_request_t) { .min_nodes = NO_VAL, .num_tasks = NO_VAL, \
	.ntasks_per_node = NO_VAL16, .cpus_per_task = NO_VAL16, \
	.pn_min_cpus = NO_VAL16, .threads_per_core = NO_VAL16, \
	.ntasks_per_core = NO_VAL16, .ntasks_per_socket = NO_VAL16, \
	.ntasks_per_tres = NO_VAL16, .pn_min_memory = NO_VAL64, __VA_ARGS__ })

/* The test cluster's node: 16 CPUs (8 cores x 2 threads), 32000 MB, 4 GPUs. */
static const k8s_node_shape_t node = { .cpus = 16, .threads_per_core = 2,
	.sockets = 2, .memory_mb = 32000, .gpus = 4, .gpus_everywhere = 4 };
/* A partition where some nodes have no GPU. */
static const k8s_node_shape_t mixed = { .cpus = 16, .threads_per_core = 2,
	.sockets = 2, .memory_mb = 32000, .gpus = 4 };
/* SelectTypeParameters=CR_Socket: whole sockets of 4 cores. */
static const k8s_node_shape_t sockets = { .cpus = 16, .threads_per_core = 2,
	.socket_cpus = 8, .memory_mb = 32000 };

static const k8s_defaults_t def_cpu = { .mem_per_cpu = 1000 };
static const k8s_defaults_t def_node = { .mem_per_node = 5000 };
static const k8s_defaults_t none = { 0 };
static const k8s_defaults_t gpu_defs = { .mem_per_cpu = 1000, .mem_per_gpu = 9000,
	.cpus_per_gpu = 5 };
static const k8s_defaults_t max_500 = { .mem_per_cpu = 400, .max_mem_per_cpu = 500 };
static const k8s_defaults_t max_4000 = { .mem_per_cpu = 1000, .max_mem_per_cpu = 4000 };

#define N16 NO_VAL16

typedef struct {
	const char *name;	/* the sbatch options this models */
	k8s_request_t req;
	const k8s_defaults_t *def;
	int rc;
	uint64_t cpus, memory_mb, gpus;
	uint16_t ntasks_per_node;
	const k8s_node_shape_t *shape;	/* NULL: the test cluster's node */
} calc_case_t;

static const calc_case_t cases[] = {
	/* CPUs: whole cores, tasks per node */
	{ "(nothing): 1 task, whole core, DefMemPerCPU", REQ(), &def_cpu, 0, 2, 2000, 0, N16 },
	{ "(nothing), no memory default: whole node", REQ(), &none, 0, 2, 32000, 0, N16 },
	{ "(nothing), DefMemPerNode", REQ(), &def_node, 0, 2, 5000, 0, N16 },
	{ "-c 2 --mem=100", REQ(.cpus_per_task = 2, .pn_min_memory = 100), &def_cpu,
	  0, 2, 100, 0, N16 },
	{ "-c 3: two cores", REQ(.cpus_per_task = 3), &def_cpu, 0, 4, 4000, 0, N16 },
	{ "-n 5: 3 cores, all tasks may share a node", REQ(.num_tasks = 5), &def_cpu,
	  0, 6, 6000, 0, N16 },
	{ "-n 3 -c 3", REQ(.num_tasks = 3, .cpus_per_task = 3), &def_cpu, 0, 10, 10000, 0, N16 },
	{ "--ntasks-per-node=3 -n 5", REQ(.num_tasks = 5, .ntasks_per_node = 3), &def_cpu,
	  0, 4, 4000, 0, N16 },
	{ "-N 2 -n 5: at most 3 tasks per node (set as the maximum)",
	  REQ(.min_nodes = 2, .num_tasks = 5), &def_cpu, 0, 4, 4000, 0, 3 },
	{ "-N 2 -n 20: 10 per node", REQ(.min_nodes = 2, .num_tasks = 20), &def_cpu,
	  0, 10, 10000, 0, 10 },
	{ "-N 2 --ntasks-per-node=3 -c 2", REQ(.min_nodes = 2, .ntasks_per_node = 3,
	  .cpus_per_task = 2), &def_cpu, 0, 6, 6000, 0, N16 },
	{ "-N 3: one task per node", REQ(.min_nodes = 3), &def_cpu, 0, 2, 2000, 0, N16 },
	{ "--mincpus=5", REQ(.pn_min_cpus = 5), &def_cpu, 0, 6, 6000, 0, N16 },
	{ "--hint=nomultithread -n 3: a core per task", REQ(.num_tasks = 3,
	  .threads_per_core = 1), &def_cpu, 0, 6, 6000, 0, N16 },
	{ "CR_Socket: -c 1 gets a whole socket", REQ(.cpus_per_task = 1), &def_cpu,
	  0, 8, 8000, 0, N16, &sockets },

	/* Whole cores per task (cons_tres counts the core, not the threads used) */
	{ "-n 8 --ntasks-per-core=1: a core per task", REQ(.num_tasks = 8,
	  .ntasks_per_core = 1), &def_cpu, 0, 16, 16000, 0, N16 },
	{ "-n 4 --ntasks-per-core=1 --mem-per-cpu=500: per allocated CPU",
	  REQ(.num_tasks = 4, .ntasks_per_core = 1, .pn_min_memory = 500 | MEM_PER_CPU),
	  &def_cpu, 0, 8, 4000, 0, N16 },
	{ "-c 3 --ntasks-per-core=1: two cores", REQ(.cpus_per_task = 3,
	  .ntasks_per_core = 1), &def_cpu, 0, 4, 4000, 0, N16 },
	{ "-n 2 -c 3 --ntasks-per-core=1: two cores each", REQ(.num_tasks = 2,
	  .cpus_per_task = 3, .ntasks_per_core = 1), &def_cpu, 0, 8, 8000, 0, N16 },
	{ "-n 3 --ntasks-per-core=2: tasks share cores", REQ(.num_tasks = 3,
	  .ntasks_per_core = 2), &def_cpu, 0, 4, 4000, 0, N16 },
	{ "--mincpus=3 --ntasks-per-core=1: a core per CPU", REQ(.pn_min_cpus = 3,
	  .ntasks_per_core = 1), &def_cpu, 0, 6, 6000, 0, N16 },
	{ "--hint=multithread -n 3: no limit (INFINITE16)", REQ(.num_tasks = 3,
	  .ntasks_per_core = INFINITE16), &def_cpu, 0, 4, 4000, 0, N16 },
	{ "--threads-per-core=1 -c 3: three cores", REQ(.cpus_per_task = 3,
	  .threads_per_core = 1), &def_cpu, 0, 6, 6000, 0, N16 },
	{ "--exclusive --ntasks-per-core=1: the node, not twice it",
	  REQ(.exclusive = true, .ntasks_per_core = 1), &def_cpu, 0, 16, 16000, 4, N16 },
	{ "-N 2 -n 4 --ntasks-per-core=1: 2 tasks, 2 cores per node",
	  REQ(.min_nodes = 2, .num_tasks = 4, .ntasks_per_core = 1), &def_cpu,
	  0, 4, 4000, 0, 2 },
	{ "-n 9 --ntasks-per-core=1: 18 CPUs fit no node", REQ(.num_tasks = 9,
	  .ntasks_per_core = 1), &def_cpu, -1, 0, 0, 0, N16 },
	{ "-n 2 --ntasks-per-socket=1: a core on each socket", REQ(.num_tasks = 2,
	  .ntasks_per_socket = 1), &def_cpu, 0, 4, 4000, 0, N16 },
	{ "--ntasks-per-socket=1, one task: nothing more", REQ(.ntasks_per_socket = 1),
	  &def_cpu, 0, 2, 2000, 0, N16 },

	/* Memory */
	{ "-n 2 --mem-per-cpu=50", REQ(.num_tasks = 2, .pn_min_memory = 50 | MEM_PER_CPU),
	  &def_cpu, 0, 2, 100, 0, N16 },
	{ "-c 1 --mem-per-cpu=50: whole core doubles memory", REQ(.cpus_per_task = 1,
	  .pn_min_memory = 50 | MEM_PER_CPU), &def_cpu, 0, 2, 100, 0, N16 },
	{ "-n 3 --mem-per-cpu=100: 4 CPUs", REQ(.num_tasks = 3,
	  .pn_min_memory = 100 | MEM_PER_CPU), &def_cpu, 0, 4, 400, 0, N16 },
	{ "--mem=0: the whole node", REQ(.pn_min_memory = 0), &def_cpu, 0, 2, 32000, 0, N16 },
	{ "--mem-per-cpu=0: the whole node", REQ(.pn_min_memory = MEM_PER_CPU), &def_cpu,
	  0, 2, 32000, 0, N16 },
	{ "MaxMemPerCPU=500 -c 2 --mem-per-cpu=1000: Slurm doubles -c",
	  REQ(.cpus_per_task = 2, .pn_min_memory = 1000 | MEM_PER_CPU), &max_500,
	  0, 4, 2000, 0, N16 },
	{ "MaxMemPerCPU=4000 --mem=10000: Slurm gives 3 CPUs", REQ(.pn_min_memory = 10000),
	  &max_4000, 0, 4, 10000, 0, N16 },
	{ "MaxMemPerCPU=500, DefMemPerCPU=400", REQ(), &max_500, 0, 2, 800, 0, N16 },

	/* Whole nodes */
	{ "--exclusive: all CPUs, DefMemPerCPU x all", REQ(.exclusive = true), &def_cpu,
	  0, 16, 16000, 4, N16 },
	{ "--exclusive, GPU-less nodes in the partition: no k8sgpu", REQ(.exclusive = true),
	  &def_cpu, 0, 16, 16000, 0, N16, &mixed },
	{ "--exclusive --mem=8000", REQ(.exclusive = true, .pn_min_memory = 8000), &def_cpu,
	  0, 16, 8000, 4, N16 },
	{ "--exclusive --mem-per-cpu=100", REQ(.exclusive = true,
	  .pn_min_memory = 100 | MEM_PER_CPU), &def_cpu, 0, 16, 1600, 4, N16 },
	{ "-N 2 --exclusive", REQ(.min_nodes = 2, .exclusive = true), &def_cpu,
	  0, 16, 16000, 4, N16 },

	/* GPUs */
	{ "--gpus-per-node=2 --cpus-per-gpu=3", REQ(.tres_per_node = "gres/gpu:2",
	  .cpus_per_tres = "gres/gpu:3"), &def_cpu, 0, 6, 6000, 2, N16 },
	{ "--gpus-per-node=2 --mem-per-gpu=3000", REQ(.tres_per_node = "gres/gpu:2",
	  .mem_per_tres = "gres/gpu:3000"), &def_cpu, 0, 2, 6000, 2, N16 },
	{ "--gres=gpu:a100:1 --mem-per-gpu=4000", REQ(.tres_per_node = "gres/gpu:a100:1",
	  .mem_per_tres = "gres/gpu:4000"), &def_cpu, 0, 2, 4000, 1, N16 },
	{ "-n 2 --gpus-per-task=1", REQ(.num_tasks = 2, .tres_per_task = "gres/gpu:1"),
	  &def_cpu, 0, 2, 2000, 2, N16 },
	{ "--gpus=8 (per job): a node holds at most its 4", REQ(.tres_per_job = "gres/gpu:8"),
	  &def_cpu, 0, 2, 2000, 4, N16 },
	{ "--gpus=1, DefMemPerGPU and DefCpuPerGPU", REQ(.tres_per_job = "gres/gpu:1"),
	  &gpu_defs, 0, 6, 9000, 1, N16 },
	{ "--gpus=1 -c 1: -c overrides DefCpuPerGPU", REQ(.tres_per_job = "gres/gpu:1",
	  .cpus_per_task = 1), &gpu_defs, 0, 2, 9000, 1, N16 },
	{ "--gres=gpu:0: no k8sgpu", REQ(.tres_per_node = "gres/gpu:0"), &def_cpu,
	  0, 2, 2000, 0, N16 },

	{ "--gpus-per-socket=1: every socket of the node", REQ(.tres_per_socket =
	  "gres/gpu:1"), &def_cpu, 0, 2, 2000, 2, N16 },
	{ "--gpus-per-socket=1 --cpus-per-gpu=3", REQ(.tres_per_socket = "gres/gpu:1",
	  .cpus_per_tres = "gres/gpu:3"), &def_cpu, 0, 6, 6000, 2, N16 },
	{ "--gpus-per-socket=1 --mem-per-gpu=1000", REQ(.tres_per_socket = "gres/gpu:1",
	  .mem_per_tres = "gres/gpu:1000"), &def_cpu, 0, 2, 2000, 2, N16 },
	{ "-n 4 --ntasks-per-gpu=2: refused (Slurm applies it to every GRES)",
	  REQ(.num_tasks = 4, .ntasks_per_tres = 2), &def_cpu, -1, 0, 0, 0, N16 },

	/* Explicit k8s GRES: normalized to at least the computed need */
	{ "--gres=k8scpu:8 above the computed 2 is kept", REQ(.tres_per_node = "gres/k8scpu:8"),
	  &def_cpu, 0, 8, 2000, 0, N16 },
	{ "--gres=k8scpu:1,k8smemory:1G below the need: cpu raised, memory kept",
	  REQ(.cpus_per_task = 4, .tres_per_node = "gres/k8scpu:1,gres/k8smemory:1G"),
	  &def_cpu, 0, 4, 1073741824ULL, 0, N16 },

	/* Not expressible per node */
	{ "-n 20 without -N", REQ(.num_tasks = 20), &def_cpu, -1, 0, 0, 0, N16 },
	{ "-c 20: no node has that many", REQ(.cpus_per_task = 20), &def_cpu, -1, 0, 0, 0, N16 },
};

static int failures;

static void check_calc(const calc_case_t *c)
{
	k8s_counts_t out = { 0 };
	char why[256] = "";
	int rc = k8s_compute(&c->req, c->shape ? c->shape : &node, c->def, &out, why,
			     sizeof(why));

	if ((rc != c->rc) || (rc && !why[0]) ||
	    (!rc && ((out.cpus != c->cpus) || (out.memory_mb != c->memory_mb) ||
		     (out.gpus != c->gpus) ||
		     (out.ntasks_per_node != c->ntasks_per_node)))) {
		printf("FAIL %s: rc=%d cpus=%llu mem=%llu gpus=%llu tpn=%u (%s)\n",
		       c->name, rc, (unsigned long long) out.cpus,
		       (unsigned long long) out.memory_mb,
		       (unsigned long long) out.gpus, out.ntasks_per_node, why);
		failures++;
	}
}

static void check_str(const char *name, const char *got, const char *want)
{
	if (strcmp(got, want)) {
		printf("FAIL %s: got \"%s\" want \"%s\"\n", name, got, want);
		failures++;
	}
}

static void check_u64(const char *name, uint64_t got, uint64_t want)
{
	if (got != want) {
		printf("FAIL %s: got %llu want %llu\n", name,
		       (unsigned long long) got, (unsigned long long) want);
		failures++;
	}
}

static void check_extra(const char *extra, bool found, uint64_t cpus, uint64_t mem,
			uint64_t gpus)
{
	uint64_t c = 99, m = 99, g = 99;

	if ((k8s_extra_held(extra, &c, &m, &g) != found) || (c != cpus) ||
	    (m != mem) || (g != gpus)) {
		printf("FAIL extra \"%s\": %llu/%llu/%llu\n", extra ? extra : "(null)",
		       (unsigned long long) c, (unsigned long long) m,
		       (unsigned long long) g);
		failures++;
	}
}

int main(void)
{
	size_t n_cases = sizeof(cases) / sizeof(cases[0]);
	char buf[256];
	k8s_counts_t counts = { 4, 2000, 0, N16 };

	for (size_t i = 0; i < n_cases; i++)
		check_calc(&cases[i]);

	/* TRES and GRES strings */
	check_u64("tres typed", k8s_tres_count("gres/gpu:a100:2,gres/gpu:1,cpu=4", "gpu"), 3);
	check_u64("tres cpu=", k8s_tres_count("cpu=4", "cpu"), 4);
	check_u64("tres 22.05", k8s_tres_count("gres:k8scpu:3", "k8scpu"), 3);
	check_u64("tres scaled", k8s_tres_count("gres/k8smemory:2K", "k8smemory"), 2048);
	check_u64("tres prefix is not a match", k8s_tres_count("gres/gpux:2", "gpu"), 0);
	check_u64("tres absent", k8s_tres_count(NULL, "gpu"), 0);
	check_u64("gres sockets", k8s_gres_count("gpu:tesla:4(S:0,1),k8scpu:16", "gpu"), 4);
	check_u64("gres no count", k8s_gres_count("gpu", "gpu"), 1);

	/* Merging replaces our entries, keeps the others, never duplicates */
	k8s_tres_merge("gres/gpu:2,gres/k8scpu:9,gres/k8smemory:1", &counts, buf, sizeof(buf));
	check_str("merge replaces", buf, "gres/gpu:2,gres/k8scpu:4,gres/k8smemory:2000");
	k8s_tres_merge(buf, &counts, buf + 128, 128);
	check_str("merge twice", buf + 128, "gres/gpu:2,gres/k8scpu:4,gres/k8smemory:2000");
	k8s_tres_merge("gres:k8scpu:9,gres/k8scpu:9", &counts, buf, sizeof(buf));
	check_str("merge drops duplicates", buf, "gres/k8scpu:4,gres/k8smemory:2000");
	counts.gpus = 1;
	k8s_tres_merge(NULL, &counts, buf, sizeof(buf));
	check_str("merge empty", buf, "gres/k8scpu:4,gres/k8smemory:2000,gres/k8sgpu:1");
	if (k8s_tres_merge("gres/gpu:2", &counts, buf, 8) != -1) {
		printf("FAIL merge overflow not reported\n");
		failures++;
	}

	/* The service's token in the node's extra field */
	check_extra("site=a nodeledger=k8scpu:4,k8smemory:8000,k8sgpu:1", true, 4, 8000, 1);
	check_extra("nodeledger=k8smemory:8000\tother=1", true, 0, 8000, 0);
	check_extra("nodeledger=", false, 0, 0, 0);
	check_extra("nodeledgerx=k8scpu:1 other", false, 0, 0, 0);
	check_extra("xnodeledger=k8scpu:1", false, 0, 0, 0);
	check_extra("", false, 0, 0, 0);
	check_extra(NULL, false, 0, 0, 0);
	/* The JSON form (jobs queue behind pods: docs/slurm.md) */
	check_extra("{\"site\":\"a\",\"nodeledger\":1,\"nodeledger_k8scpu\":4,"
		    "\"nodeledger_k8smemory\":8000,\"nodeledger_k8sgpu\":1}",
		    true, 4, 8000, 1);
	check_extra(" { \"nodeledger_k8smemory\" : 512 }", true, 0, 512, 0);
	check_extra("{\"nodeledger\":1}", false, 0, 0, 0);
	check_extra("{\"nodeledger_k8scpu\":\"x\"}", false, 0, 0, 0);
	check_extra("{\"site\":\"nodeledger=k8scpu:4\"}", false, 0, 0, 0);

	/* Every GPU withheld, written into either form */
	check_u64("set gpus json", k8s_extra_set_gpus("{\"nodeledger\":1,\"nodeledger_k8sgpu\": 1,\"x\":2}", 4, buf, sizeof(buf)), 0);
	check_str("set gpus json", buf, "{\"nodeledger\":1,\"nodeledger_k8sgpu\": 4,\"x\":2}");
	check_u64("set gpus token", k8s_extra_set_gpus("site nodeledger=k8scpu:4,k8smemory:2000,k8sgpu:12 b", 16, buf, sizeof(buf)), 0);
	check_str("set gpus token", buf, "site nodeledger=k8scpu:4,k8smemory:2000,k8sgpu:16 b");
	check_u64("set gpus none", k8s_extra_set_gpus("{\"nodeledger\":1}", 4, buf, sizeof(buf)), (uint64_t) -1);
	check_u64("set gpus other token", k8s_extra_set_gpus("k8sgpu:1 nodeledger=k8scpu:4", 4, buf, sizeof(buf)), (uint64_t) -1);
	check_u64("set gpus null", k8s_extra_set_gpus(NULL, 4, buf, sizeof(buf)), (uint64_t) -1);
	check_u64("set gpus small", k8s_extra_set_gpus("nodeledger=k8sgpu:1", 4, buf, 5), (uint64_t) -1);

	printf("%s: %zu calculation cases, %d failures\n", failures ? "FAIL" : "ok",
	       n_cases, failures);
	return failures ? 1 : 0;
}
