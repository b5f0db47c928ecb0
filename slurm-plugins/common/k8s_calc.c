/*****************************************************************************\
 *  k8s_calc.c - what a Slurm job holds per node, in k8scpu/k8smemory/k8sgpu.
 *
 *  Rounding always goes up: a GRES request that undercounts what Slurm will
 *  allocate lets a job overlap resources Kubernetes holds.
\*****************************************************************************/

#include <ctype.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <slurm/slurm.h>

#include "k8s_calc.h"

#define K8S_NAMES_CNT 3
static const char *k8s_names[K8S_NAMES_CNT] = {
	"k8scpu", "k8smemory", "k8sgpu"
};

static bool _set16(uint16_t v) { return (v != NO_VAL16) && (v != 0); }
static bool _set32(uint32_t v) { return (v != NO_VAL) && (v != 0); }
static uint64_t _max(uint64_t a, uint64_t b) { return (a > b) ? a : b; }
static uint64_t _min(uint64_t a, uint64_t b) { return (a < b) ? a : b; }
static uint64_t _ceil_div(uint64_t a, uint64_t b)
{
	return b ? (a + b - 1) / b : a;
}

static bool _name_is(const char *n, size_t n_len, const char *name)
{
	return (strlen(name) == n_len) && !strncmp(n, name, n_len);
}

/* "12", "64K", "2G" -> value; false when not a count. */
static bool _parse_count(const char *s, size_t len, uint64_t *out)
{
	uint64_t v = 0, scale = 1;
	size_t i = 0;

	if (!len)
		return false;
	for (; (i < len) && isdigit((unsigned char) s[i]); i++)
		v = v * 10 + (uint64_t) (s[i] - '0');
	if (!i)
		return false;
	if (i < len) {
		switch (toupper((unsigned char) s[i])) {
		case 'K': scale = 1024ULL; break;
		case 'M': scale = 1024ULL * 1024; break;
		case 'G': scale = 1024ULL * 1024 * 1024; break;
		case 'T': scale = 1024ULL * 1024 * 1024 * 1024; break;
		default: return false;
		}
		if (i + 1 != len)
			return false;
	}
	*out = v * scale;
	return true;
}

/*
 * One TRES entry: "gres/gpu:a100:2", "gres:gpu:2" (22.05), "gpu:2", "cpu=4".
 * Sets the name span and the count (1 when a GRES names no count).
 */
static void _parse_tres_entry(const char *e, size_t len, const char **name,
			      size_t *name_len, uint64_t *count)
{
	const char *end = e + len, *last;

	if ((len > 5) && (!strncmp(e, "gres/", 5) || !strncmp(e, "gres:", 5))) {
		e += 5;
		len -= 5;
	}
	*name = e;
	*name_len = strcspn(e, ":=");
	if (*name_len > len)
		*name_len = len;
	*count = 1;
	for (last = end; (last > e) && (last[-1] != ':') && (last[-1] != '=');
	     last--)
		;
	if ((last > e) && !_parse_count(last, (size_t) (end - last), count))
		*count = 1;
}

/* Next comma/semicolon separated entry outside parentheses. */
static bool _next_entry(const char **cursor, const char **entry, size_t *len)
{
	const char *p = *cursor;
	int depth = 0;

	if (!p)
		return false;
	while (*p == ',' || *p == ';' || *p == ' ')
		p++;
	if (!*p)
		return false;
	*entry = p;
	for (; *p; p++) {
		if (*p == '(')
			depth++;
		else if ((*p == ')') && depth)
			depth--;
		else if (!depth && ((*p == ',') || (*p == ';')))
			break;
	}
	*len = (size_t) (p - *entry);
	*cursor = p;
	return true;
}

extern uint64_t k8s_tres_count(const char *tres, const char *name)
{
	const char *cursor = tres, *entry, *n;
	size_t len, n_len, want = strlen(name);
	uint64_t total = 0, count;

	while (_next_entry(&cursor, &entry, &len)) {
		_parse_tres_entry(entry, len, &n, &n_len, &count);
		if ((n_len == want) && !strncmp(n, name, want))
			total += count;
	}
	return total;
}

extern uint64_t k8s_gres_count(const char *gres, const char *name)
{
	const char *cursor = gres, *entry, *n;
	size_t len, n_len, want = strlen(name), paren;
	uint64_t total = 0, count;

	while (_next_entry(&cursor, &entry, &len)) {
		paren = strcspn(entry, "(");
		if (paren < len)
			len = paren;	/* drop "(S:0-1)" */
		_parse_tres_entry(entry, len, &n, &n_len, &count);
		if ((n_len == want) && !strncmp(n, name, want))
			total += count;
	}
	return total;
}

static bool _is_ours(const char *entry, size_t len)
{
	const char *n;
	size_t n_len;
	uint64_t count;

	_parse_tres_entry(entry, len, &n, &n_len, &count);
	for (int i = 0; i < K8S_NAMES_CNT; i++) {
		if (_name_is(n, n_len, k8s_names[i]))
			return true;
	}
	return false;
}

extern int k8s_tres_merge(const char *tres, const k8s_counts_t *counts,
			  char *out, size_t out_len)
{
	const char *cursor = tres, *entry;
	const char *sep = "";
	size_t len, used = 0;
	int n;
	uint64_t values[K8S_NAMES_CNT] = { counts->cpus, counts->memory_mb,
					   counts->gpus };

	if (!out_len)
		return -1;
	out[0] = '\0';
	while (_next_entry(&cursor, &entry, &len)) {
		if (_is_ours(entry, len))
			continue;	/* replaced below, never duplicated */
		n = snprintf(out + used, out_len - used, "%s%.*s", sep,
			     (int) len, entry);
		if ((n < 0) || ((size_t) n >= out_len - used))
			return -1;
		used += (size_t) n;
		sep = ",";
	}
	for (int i = 0; i < K8S_NAMES_CNT; i++) {
		if (!values[i])
			continue;	/* Slurm drops zero counts anyway */
		n = snprintf(out + used, out_len - used, "%sgres/%s:%llu", sep,
			     k8s_names[i], (unsigned long long) values[i]);
		if ((n < 0) || ((size_t) n >= out_len - used))
			return -1;
		used += (size_t) n;
		sep = ",";
	}
	return 0;
}

/* The integer of "key": N in a JSON object; false without one. */
static bool _json_count(const char *json, const char *key, uint64_t *count)
{
	const char *at = strstr(json, key);
	char *end;

	if (!at)
		return false;
	at += strlen(key);
	at += strspn(at, " \t");
	if (*at != ':')
		return false;
	at++;
	at += strspn(at, " \t");
	if ((*at < '0') || (*at > '9'))
		return false;
	*count = strtoull(at, &end, 10);
	return true;
}

/*
 * The JSON form: keys "nodeledger_k8scpu", "nodeledger_k8smemory" and
 * "nodeledger_k8sgpu" of the object slurmctld matches jobs' extra constraints
 * against (absent keys: nothing held).
 */
static bool _extra_held_json(const char *extra, uint64_t *cpus,
			     uint64_t *memory_mb, uint64_t *gpus)
{
	bool found = false;

	found |= _json_count(extra, "\"nodeledger_k8scpu\"", cpus);
	found |= _json_count(extra, "\"nodeledger_k8smemory\"", memory_mb);
	found |= _json_count(extra, "\"nodeledger_k8sgpu\"", gpus);
	return found;
}

extern bool k8s_extra_held(const char *extra, uint64_t *cpus,
			   uint64_t *memory_mb, uint64_t *gpus)
{
	const char *tok = extra, *cursor, *entry;
	size_t len, tok_len;
	char value[256];

	*cpus = *memory_mb = *gpus = 0;
	if (extra && (extra[strspn(extra, " \t")] == '{'))
		return _extra_held_json(extra, cpus, memory_mb, gpus);
	while (tok && *tok) {
		tok += strspn(tok, " \t");
		tok_len = strcspn(tok, " \t");
		if ((tok_len > 11) && !strncmp(tok, "nodeledger=", 11)) {
			if (tok_len - 11 >= sizeof(value))
				return false;
			memcpy(value, tok + 11, tok_len - 11);
			value[tok_len - 11] = '\0';
			cursor = value;
			while (_next_entry(&cursor, &entry, &len)) {
				const char *n;
				size_t n_len;
				uint64_t count = 0;

				_parse_tres_entry(entry, len, &n, &n_len,
						  &count);
				if (_name_is(n, n_len, "k8scpu"))
					*cpus = count;
				else if (_name_is(n, n_len, "k8smemory"))
					*memory_mb = count;
				else if (_name_is(n, n_len, "k8sgpu"))
					*gpus = count;
			}
			return true;
		}
		tok += tok_len;
	}
	return false;
}

/* Where the held GPU count is in "extra" (either form); false if absent. */
static bool _extra_gpus_at(const char *extra, size_t *start, size_t *len)
{
	const char *at = NULL, *tok = extra;
	size_t tok_len;

	if (!extra)
		return false;
	if (extra[strspn(extra, " \t")] == '{') {
		if ((at = strstr(extra, "\"nodeledger_k8sgpu\""))) {
			at += strlen("\"nodeledger_k8sgpu\"");
			at += strspn(at, " \t");
			at = (*at == ':') ? at + 1 + strspn(at + 1, " \t") : NULL;
		}
	} else {
		while (*tok && !at) {
			tok += strspn(tok, " \t");
			tok_len = strcspn(tok, " \t");
			if ((tok_len > 11) && !strncmp(tok, "nodeledger=", 11)) {
				for (const char *c = tok + 10; c && (c < tok + tok_len);
				     c = strpbrk(c + 1, ",= \t")) {
					if (!strncmp(c + 1, "k8sgpu:", 7)) {
						at = c + 8;
						break;
					}
				}
			}
			tok += tok_len;
		}
	}
	if (!at || !isdigit((unsigned char) *at))
		return false;
	*start = (size_t) (at - extra);
	*len = strspn(at, "0123456789");
	return true;
}

extern int k8s_extra_set_gpus(const char *extra, uint64_t gpus, char *out,
			      size_t out_len)
{
	size_t start, len;
	int n;

	if (!_extra_gpus_at(extra, &start, &len))
		return -1;
	n = snprintf(out, out_len, "%.*s%" PRIu64 "%s", (int) start, extra,
		     gpus, extra + start + len);
	return ((n < 0) || ((size_t) n >= out_len)) ? -1 : 0;
}

/* Tasks this node may run: the per-node maximum Slurm will respect. */
static uint64_t _tasks_per_node(const k8s_request_t *req, k8s_counts_t *out)
{
	if (_set16(req->ntasks_per_node))
		return req->ntasks_per_node;
	if (!_set32(req->num_tasks))
		return 1;
	if (_set32(req->min_nodes) && (req->min_nodes > 1)) {
		/* With -n, --ntasks-per-node is a maximum: now exact. */
		uint64_t tpn = _ceil_div(req->num_tasks, req->min_nodes);
		out->ntasks_per_node = (uint16_t) tpn;
		return tpn;
	}
	return req->num_tasks;	/* worst case: every task on one node */
}

static uint64_t _gpus_per_node(const k8s_request_t *req,
			       const k8s_node_shape_t *node, uint64_t tpn)
{
	uint64_t g;

	if ((g = k8s_tres_count(req->tres_per_node, "gpu")))
		return g;
	if ((g = k8s_tres_count(req->tres_per_task, "gpu")))
		return g * tpn;
	if ((g = k8s_tres_count(req->tres_per_socket, "gpu"))) {
		/*
		 * Slurm gives GPUs per socket the job's cores touch, and
		 * which sockets is decided only at allocation (measured:
		 * --sockets-per-node=1 may still get GPUs of both). Every
		 * socket of the largest node, then.
		 */
		return g * (node->sockets ? node->sockets : 1);
	}
	if ((g = k8s_tres_count(req->tres_per_job, "gpu"))) {
		/* Any split is possible: a node may get all of them it has. */
		if (node->gpus && (g > node->gpus))
			return node->gpus;
		return g;
	}
	return 0;
}

/* Memory a node gives the job when no memory option was used. */
static uint64_t _default_memory(const k8s_request_t *req,
				const k8s_node_shape_t *node,
				const k8s_defaults_t *def, uint64_t cpus,
				uint64_t gpus)
{
	uint64_t per_gpu;

	if (gpus && (per_gpu = k8s_tres_count(req->mem_per_tres, "gpu")))
		return per_gpu * gpus;
	if (gpus && def->mem_per_gpu)
		return def->mem_per_gpu * gpus;
	if (def->mem_per_cpu)
		return def->mem_per_cpu * cpus;
	if (def->mem_per_node)
		return def->mem_per_node;
	return node->memory_mb;	/* no default: Slurm gives the whole node */
}

/*
 * CPUs of a core the job may use (cons_tres' ncpus_per_core in job_test.c):
 * --ntasks-per-core caps it at tasks x CPUs per task, --threads-per-core
 * (and --hint=nomultithread, compute_bound, memory_bound) at its value.
 * Slurm still allocates, and counts, the whole core.
 */
static uint64_t _usable_per_core(const k8s_request_t *req, uint64_t tpc,
				 uint64_t cpt)
{
	uint64_t usable = tpc;

	if (_set16(req->ntasks_per_core) && (req->ntasks_per_core != INFINITE16))
		usable = _min(usable, (uint64_t) req->ntasks_per_core * cpt);
	if (_set16(req->threads_per_core))
		usable = _min(usable, req->threads_per_core);
	return usable ? usable : 1;
}

/*
 * Round up to what select/cons_tres allocates: whole cores (or sockets).
 * cpus: what the job needs; tpn, cpt: its tasks here and CPUs per task.
 */
static uint64_t _allocated_cpus(const k8s_request_t *req,
				const k8s_node_shape_t *node, uint64_t cpus,
				uint64_t tpn, uint64_t cpt)
{
	uint64_t tpc = node->threads_per_core ? node->threads_per_core : 1;
	uint64_t usable = _usable_per_core(req, tpc, cpt);
	uint64_t cores = _ceil_div(cpus, usable), task_cores;
	bool per_task = (usable < tpc) || (_set16(req->ntasks_per_core) &&
					   (req->ntasks_per_core != INFINITE16));

	if (per_task) {
		/*
		 * Tasks do not share a core beyond "usable" CPUs: one-CPU
		 * tasks pack "usable" to a core, bigger ones take whole
		 * cores each (-n 2 -c 3 --ntasks-per-core=1: 4 cores).
		 */
		task_cores = (cpt == 1) ? _ceil_div(tpn, usable) :
			tpn * _ceil_div(cpt, usable);
		cores = _max(cores, task_cores);
	}
	if (_set16(req->ntasks_per_socket) &&
	    (req->ntasks_per_socket != INFINITE16) && (tpn > 1)) {
		/*
		 * Tasks split over sockets may each leave a core partly
		 * used: at most one more core per extra socket.
		 */
		cores += _min(tpn, node->sockets ? node->sockets : 1) - 1;
	}
	cpus = cores * tpc;
	if (node->socket_cpus)
		cpus = _ceil_div(cpus, node->socket_cpus) * node->socket_cpus;
	return cpus;
}

extern int k8s_compute(const k8s_request_t *req, const k8s_node_shape_t *node,
		       const k8s_defaults_t *def, k8s_counts_t *out,
		       char *why, size_t why_len)
{
	uint64_t tpn, cpt, gpus, cpg, cpus, mem = NO_VAL64, mem_per_cpu = 0;

	out->ntasks_per_node = NO_VAL16;
	if (_set16(req->ntasks_per_tres)) {
		/*
		 * Slurm applies --ntasks-per-gpu to every GRES of the job,
		 * so k8smemory:2000 would ask for 2000 tasks' CPUs (gres.c
		 * sets ntasks_per_gres on each): no job could ever run.
		 */
		snprintf(why, why_len,
			 "--ntasks-per-gpu cannot be combined with the k8s "
			 "GRES Slurm needs here: use -n with --gpus, "
			 "--gpus-per-node or --gpus-per-task instead");
		return -1;
	}
	tpn = _tasks_per_node(req, out);
	gpus = _gpus_per_node(req, node, tpn);
	cpt = _set16(req->cpus_per_task) ? req->cpus_per_task : 1;

	if (req->pn_min_memory == NO_VAL64) {
		;	/* a default, below: it may depend on the CPUs */
	} else if (req->pn_min_memory & MEM_PER_CPU) {
		mem_per_cpu = req->pn_min_memory & ~MEM_PER_CPU;
		uint64_t max = def->max_mem_per_cpu, ratio;

		if (max && (mem_per_cpu > max)) {
			/* Slurm keeps the memory, multiplies CPUs per task. */
			ratio = _ceil_div(mem_per_cpu, max);
			cpt *= ratio;
			mem_per_cpu = _ceil_div(mem_per_cpu, ratio);
		}
	} else {
		mem = req->pn_min_memory ? req->pn_min_memory : node->memory_mb;
	}

	cpus = tpn * cpt;
	if (_set16(req->pn_min_cpus))
		cpus = _max(cpus, req->pn_min_cpus);
	cpg = k8s_tres_count(req->cpus_per_tres, "gpu");
	if (!cpg && !_set16(req->cpus_per_task))
		cpg = def->cpus_per_gpu;
	if (gpus && cpg)
		cpus = _max(cpus, cpg * gpus);
	if ((mem != NO_VAL64) && def->max_mem_per_cpu)
		cpus = _max(cpus, _ceil_div(mem, def->max_mem_per_cpu));
	if (req->exclusive) {
		/*
		 * A whole node: all its CPUs, so any node where Kubernetes
		 * holds something is out. GPUs only as many as every node
		 * has, so GPU-less nodes of the partition stay usable.
		 */
		cpus = node->cpus;
		gpus = _max(gpus, node->gpus_everywhere);
	} else {
		cpus = _allocated_cpus(req, node, cpus, tpn, cpt);
	}

	if (node->cpus && (cpus > node->cpus)) {
		if (cpt > node->cpus)
			snprintf(why, why_len,
				 "each task needs %llu CPUs but the largest "
				 "node has %u: lower --cpus-per-task (or "
				 "--mem-per-cpu)",
				 (unsigned long long) cpt, node->cpus);
		else
			snprintf(why, why_len,
				 "this job needs %llu CPUs on one node but the "
				 "largest node has %u: spread it with "
				 "-N/--nodes or --ntasks-per-node",
				 (unsigned long long) cpus, node->cpus);
		return -1;
	}

	if (mem_per_cpu)
		mem = mem_per_cpu * cpus;	/* times allocated CPUs */
	else if (req->pn_min_memory == MEM_PER_CPU)
		mem = node->memory_mb;		/* --mem-per-cpu=0: all of it */
	else if (mem == NO_VAL64)
		mem = _default_memory(req, node, def, cpus, gpus);

	out->cpus = _max(cpus, k8s_tres_count(req->tres_per_node, "k8scpu"));
	out->memory_mb = _max(mem, k8s_tres_count(req->tres_per_node,
						  "k8smemory"));
	out->gpus = _max(gpus, k8s_tres_count(req->tres_per_node, "k8sgpu"));
	return 0;
}
