/*****************************************************************************\
 *  test_k8s_calc.c - table-driven tests of the pure k8s calculation.
 *  Built and run by "make check" (and under valgrind by "make check-valgrind").
\*****************************************************************************/

#include <stdio.h>
#include <string.h>

#include <slurm/slurm.h>

#include "k8s_calc.h"

/* Most cases leave the trailing optional field (shape) out. */
#pragma GCC diagnostic ignored "-Wmissing-field-initializers"

/* The test cluster's nodes: 16 CPUs (2 threads per core), 32000 MB, 4 GPUs. */
static const k8s_node_shape_t node = { 16, 2, 32000, 4, 4 };
static const k8s_defaults_t def_cpu = { .mem_per_cpu = 1000 };
static const k8s_defaults_t none = { 0 };

#define UNSET { NO_VAL, NO_VAL, NO_VAL16, NO_VAL16, NO_VAL16, false, NO_VAL64, \
		NULL, NULL, NULL, NULL, NULL }

typedef struct {
	const char *name;	/* the sbatch options this models */
	k8s_request_t req;
	const k8s_defaults_t *def;
	int rc;
	uint64_t cpus, memory_mb, gpus;
	uint16_t ntasks_per_node;
	const k8s_node_shape_t *shape;	/* NULL: the test cluster's node */
} calc_case_t;

/* A partition where some nodes have no GPU. */
static const k8s_node_shape_t mixed = { 16, 2, 32000, 4, 0 };

static k8s_request_t with(k8s_request_t r) { return r; }

static int failures;

static void check_calc(const calc_case_t *c)
{
	k8s_counts_t out = { 0 };
	char why[256] = "";
	int rc = k8s_compute(&c->req, c->shape ? c->shape : &node, c->def, &out, why,
			     sizeof(why));

	if ((rc != c->rc) ||
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

int main(void)
{
	k8s_request_t u = UNSET;
	char buf[256];
	uint64_t c, m, g;
	calc_case_t cases[] = {
		{ "(nothing): 1 task, whole core, DefMemPerCPU", u, &def_cpu, 0, 2, 2000, 0, NO_VAL16 },
		{ "(nothing), no memory default: whole node memory", u, &none, 0, 2, 32000, 0, NO_VAL16 },
		{ "-c 2 --mem=100", with((k8s_request_t) { .min_nodes = NO_VAL, .num_tasks = NO_VAL,
		  .ntasks_per_node = NO_VAL16, .cpus_per_task = 2, .threads_per_core = NO_VAL16,
		  .pn_min_memory = 100 }), &def_cpu, 0, 2, 100, 0, NO_VAL16 },
		{ "-c 3: rounds up to 2 cores", with((k8s_request_t) { .min_nodes = NO_VAL,
		  .num_tasks = NO_VAL, .ntasks_per_node = NO_VAL16, .cpus_per_task = 3,
		  .threads_per_core = NO_VAL16, .pn_min_memory = NO_VAL64 }), &def_cpu, 0, 4, 4000, 0, NO_VAL16 },
		{ "-n 5: 6 CPUs (3 cores), all tasks may share a node", with((k8s_request_t) {
		  .min_nodes = NO_VAL, .num_tasks = 5, .ntasks_per_node = NO_VAL16,
		  .cpus_per_task = NO_VAL16, .threads_per_core = NO_VAL16,
		  .pn_min_memory = NO_VAL64 }), &def_cpu, 0, 6, 6000, 0, NO_VAL16 },
		{ "-n 2 --mem-per-cpu=50: per CPU times allocated CPUs", with((k8s_request_t) {
		  .min_nodes = NO_VAL, .num_tasks = 2, .ntasks_per_node = NO_VAL16,
		  .cpus_per_task = NO_VAL16, .threads_per_core = NO_VAL16,
		  .pn_min_memory = 50 | MEM_PER_CPU }), &def_cpu, 0, 2, 100, 0, NO_VAL16 },
		{ "-c 1 --mem-per-cpu=50: whole core doubles memory", with((k8s_request_t) {
		  .min_nodes = NO_VAL, .num_tasks = NO_VAL, .ntasks_per_node = NO_VAL16,
		  .cpus_per_task = 1, .threads_per_core = NO_VAL16,
		  .pn_min_memory = 50 | MEM_PER_CPU }), &def_cpu, 0, 2, 100, 0, NO_VAL16 },
		{ "-N 2 -n 5: at most 3 tasks per node (set as the maximum)", with((k8s_request_t) {
		  .min_nodes = 2, .num_tasks = 5, .ntasks_per_node = NO_VAL16,
		  .cpus_per_task = NO_VAL16, .threads_per_core = NO_VAL16,
		  .pn_min_memory = NO_VAL64 }), &def_cpu, 0, 4, 4000, 0, 3 },
		{ "-N 2 --ntasks-per-node=3 -c 2", with((k8s_request_t) { .min_nodes = 2,
		  .num_tasks = NO_VAL, .ntasks_per_node = 3, .cpus_per_task = 2,
		  .threads_per_core = NO_VAL16, .pn_min_memory = NO_VAL64 }), &def_cpu, 0, 6, 6000, 0, NO_VAL16 },
		{ "-N 3 (one task per node)", with((k8s_request_t) { .min_nodes = 3,
		  .num_tasks = NO_VAL, .ntasks_per_node = NO_VAL16, .cpus_per_task = NO_VAL16,
		  .threads_per_core = NO_VAL16, .pn_min_memory = NO_VAL64 }), &def_cpu, 0, 2, 2000, 0, NO_VAL16 },
		{ "--mem=0: the whole node's memory", with((k8s_request_t) { .min_nodes = NO_VAL,
		  .num_tasks = NO_VAL, .ntasks_per_node = NO_VAL16, .cpus_per_task = NO_VAL16,
		  .threads_per_core = NO_VAL16, .pn_min_memory = 0 }), &def_cpu, 0, 2, 32000, 0, NO_VAL16 },
		{ "--exclusive: whole node, DefMemPerCPU x all CPUs", with((k8s_request_t) {
		  .min_nodes = NO_VAL, .num_tasks = NO_VAL, .ntasks_per_node = NO_VAL16,
		  .cpus_per_task = NO_VAL16, .threads_per_core = NO_VAL16, .exclusive = true,
		  .pn_min_memory = NO_VAL64 }), &def_cpu, 0, 16, 16000, 4, NO_VAL16 },
		{ "--exclusive with GPU-less nodes in the partition: no k8sgpu",
		  with((k8s_request_t) { .min_nodes = NO_VAL, .num_tasks = NO_VAL,
		  .ntasks_per_node = NO_VAL16, .cpus_per_task = NO_VAL16,
		  .threads_per_core = NO_VAL16, .exclusive = true,
		  .pn_min_memory = NO_VAL64 }), &def_cpu, 0, 16, 16000, 0, NO_VAL16, &mixed },
		{ "--exclusive --mem=8000", with((k8s_request_t) { .min_nodes = NO_VAL,
		  .num_tasks = NO_VAL, .ntasks_per_node = NO_VAL16, .cpus_per_task = NO_VAL16,
		  .threads_per_core = NO_VAL16, .exclusive = true, .pn_min_memory = 8000 }),
		  &def_cpu, 0, 16, 8000, 4, NO_VAL16 },
		{ "--gpus-per-node=2 --cpus-per-gpu=3", with((k8s_request_t) { .min_nodes = NO_VAL,
		  .num_tasks = NO_VAL, .ntasks_per_node = NO_VAL16, .cpus_per_task = NO_VAL16,
		  .threads_per_core = NO_VAL16, .pn_min_memory = NO_VAL64,
		  .tres_per_node = "gres/gpu:2", .cpus_per_tres = "gres/gpu:3" }),
		  &def_cpu, 0, 6, 6000, 2, NO_VAL16 },
		{ "--gres=gpu:a100:1 --mem-per-gpu=4000", with((k8s_request_t) { .min_nodes = NO_VAL,
		  .num_tasks = NO_VAL, .ntasks_per_node = NO_VAL16, .cpus_per_task = NO_VAL16,
		  .threads_per_core = NO_VAL16, .pn_min_memory = NO_VAL64,
		  .tres_per_node = "gres/gpu:a100:1", .mem_per_tres = "gres/gpu:4000" }),
		  &def_cpu, 0, 2, 4000, 1, NO_VAL16 },
		{ "-n 2 --gpus-per-task=1", with((k8s_request_t) { .min_nodes = NO_VAL,
		  .num_tasks = 2, .ntasks_per_node = NO_VAL16, .cpus_per_task = NO_VAL16,
		  .threads_per_core = NO_VAL16, .pn_min_memory = NO_VAL64,
		  .tres_per_task = "gres/gpu:1" }), &def_cpu, 0, 2, 2000, 2, NO_VAL16 },
		{ "--gpus=8 (per job): a node holds at most its 4", with((k8s_request_t) {
		  .min_nodes = NO_VAL, .num_tasks = NO_VAL, .ntasks_per_node = NO_VAL16,
		  .cpus_per_task = NO_VAL16, .threads_per_core = NO_VAL16,
		  .pn_min_memory = NO_VAL64, .tres_per_job = "gres/gpu:8" }), &def_cpu, 0, 2, 2000, 4, NO_VAL16 },
		{ "--gpus=1 with DefMemPerGPU and DefCpuPerGPU", with((k8s_request_t) {
		  .min_nodes = NO_VAL, .num_tasks = NO_VAL, .ntasks_per_node = NO_VAL16,
		  .cpus_per_task = NO_VAL16, .threads_per_core = NO_VAL16,
		  .pn_min_memory = NO_VAL64, .tres_per_job = "gres/gpu:1" }),
		  &(k8s_defaults_t) { .mem_per_cpu = 1000, .mem_per_gpu = 9000, .cpus_per_gpu = 5 },
		  0, 6, 9000, 1, NO_VAL16 },
		{ "--hint=nomultithread -n 3: a core per task", with((k8s_request_t) {
		  .min_nodes = NO_VAL, .num_tasks = 3, .ntasks_per_node = NO_VAL16,
		  .cpus_per_task = NO_VAL16, .threads_per_core = 1,
		  .pn_min_memory = NO_VAL64 }), &def_cpu, 0, 6, 6000, 0, NO_VAL16 },
		{ "explicit --gres=k8scpu:8 above the computed 2 is kept", with((k8s_request_t) {
		  .min_nodes = NO_VAL, .num_tasks = NO_VAL, .ntasks_per_node = NO_VAL16,
		  .cpus_per_task = NO_VAL16, .threads_per_core = NO_VAL16,
		  .pn_min_memory = NO_VAL64, .tres_per_node = "gres/k8scpu:8" }),
		  &def_cpu, 0, 8, 2000, 0, NO_VAL16 },
		{ "explicit --gres=k8scpu:1 below the computed 4 is raised", with((k8s_request_t) {
		  .min_nodes = NO_VAL, .num_tasks = NO_VAL, .ntasks_per_node = NO_VAL16,
		  .cpus_per_task = 4, .threads_per_core = NO_VAL16,
		  .pn_min_memory = NO_VAL64, .tres_per_node = "gres/k8scpu:1,gres/k8smemory:1G" }),
		  &def_cpu, 0, 4, 1073741824ULL, 0, NO_VAL16 },
		{ "-n 20 without -N cannot be expressed per node", with((k8s_request_t) {
		  .min_nodes = NO_VAL, .num_tasks = 20, .ntasks_per_node = NO_VAL16,
		  .cpus_per_task = NO_VAL16, .threads_per_core = NO_VAL16,
		  .pn_min_memory = NO_VAL64 }), &def_cpu, -1, 0, 0, 0, NO_VAL16 },
		{ "-N 2 -n 20 fits 10 per node", with((k8s_request_t) { .min_nodes = 2,
		  .num_tasks = 20, .ntasks_per_node = NO_VAL16, .cpus_per_task = NO_VAL16,
		  .threads_per_core = NO_VAL16, .pn_min_memory = NO_VAL64 }), &def_cpu, 0, 10, 10000, 0, 10 },
	};

	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++)
		check_calc(&cases[i]);

	/* TRES and GRES parsing */
	check_u64("tres typed", k8s_tres_count("gres/gpu:a100:2,gres/gpu:1,cpu=4", "gpu"), 3);
	check_u64("tres cpu=", k8s_tres_count("cpu=4", "cpu"), 4);
	check_u64("tres 22.05", k8s_tres_count("gres:k8scpu:3", "k8scpu"), 3);
	check_u64("tres scaled", k8s_tres_count("gres/k8smemory:2K", "k8smemory"), 2048);
	check_u64("tres absent", k8s_tres_count(NULL, "gpu"), 0);
	check_u64("gres sockets", k8s_gres_count("gpu:tesla:4(S:0,1),k8scpu:16", "gpu"), 4);
	check_u64("gres no count", k8s_gres_count("gpu", "gpu"), 1);

	/* Merging never duplicates and keeps other entries */
	k8s_counts_t counts = { 4, 2000, 0, NO_VAL16 };
	k8s_tres_merge("gres/gpu:2,gres/k8scpu:9,gres/k8smemory:1", &counts, buf, sizeof(buf));
	check_str("merge replaces", buf, "gres/gpu:2,gres/k8scpu:4,gres/k8smemory:2000");
	k8s_tres_merge(buf, &counts, buf + 128, 128);
	check_str("merge twice", buf + 128, "gres/gpu:2,gres/k8scpu:4,gres/k8smemory:2000");
	counts.gpus = 1;
	k8s_tres_merge(NULL, &counts, buf, sizeof(buf));
	check_str("merge empty", buf, "gres/k8scpu:4,gres/k8smemory:2000,gres/k8sgpu:1");
	if (k8s_tres_merge("gres/gpu:2", &counts, buf, 8) != -1) {
		printf("FAIL merge overflow not reported\n");
		failures++;
	}

	/* The service's token in the node's extra field */
	if (!k8s_extra_held("site=a nodeledger=k8scpu:4,k8smemory:8000,k8sgpu:1", &c, &m, &g) ||
	    (c != 4) || (m != 8000) || (g != 1)) {
		printf("FAIL extra token\n");
		failures++;
	}
	if (k8s_extra_held("nodeledgerx=1 other", &c, &m, &g) || c || m || g) {
		printf("FAIL extra without token\n");
		failures++;
	}
	k8s_extra_held(NULL, &c, &m, &g);

	printf("%s: %zu calculation cases, %d failures\n", failures ? "FAIL" : "ok",
	       sizeof(cases) / sizeof(cases[0]), failures);
	return failures ? 1 : 0;
}
