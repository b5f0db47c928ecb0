/*****************************************************************************\
 *  k8s_gres.c - set a node's k8s GRES totals inside slurmctld, shared by the
 *  node_features and prep plugins (Slurm's internal GRES state: built only
 *  against a configured Slurm source tree, never into the unit tests).
\*****************************************************************************/

#include <inttypes.h>

#include <slurm/slurm.h>

#include "src/common/list.h"
#include "src/common/node_conf.h"
#include "src/common/read_config.h"
#include "src/common/xmalloc.h"
#include "src/common/xstring.h"
#include "src/interfaces/gres.h"

#include "k8s_gres.h"

static gres_node_state_t *_gres_ns(node_record_t *node_ptr, char *name,
				   gres_state_t **gres_state_node)
{
	uint32_t plugin_id = gres_build_id(name);

	if (!node_ptr->gres_list ||
	    !(*gres_state_node = list_find_first(node_ptr->gres_list,
						 gres_find_id, &plugin_id)))
		return NULL;
	return (*gres_state_node)->gres_data;
}

/*
 * Move slurmctld's cluster-wide count of one GRES by "delta" (uint64_t
 * arithmetic wraps, so it may be negative). gres_node_feature() never touches
 * that count while every runtime "update node gres=" moves it by "new - old":
 * left alone it drifts, and when it lands on NO_VAL64 slurmctld rejects every
 * job that asks for the GRES ("Invalid Trackable RESource (TRES)
 * specification"). Slurm's own reconfiguration is the only writer of the
 * count, and it adds "new - old": hand it the node's state alone with "old"
 * chosen to make up the difference.
 */
static void _move_cluster_count(node_record_t *node_ptr, char *name,
				gres_state_t *gres_state_node, uint64_t delta)
{
	gres_node_state_t *gres_ns = gres_state_node->gres_data;
	uint64_t keep = gres_ns->gres_cnt_config;
	char *entry, *unused = NULL;
	list_t *one;

	if (!delta)
		return;
	gres_ns->gres_cnt_config = keep - delta;
	entry = xstrdup_printf("%s:%"PRIu64, name, keep);
	one = list_create(NULL);	/* borrows the node's state */
	list_append(one, gres_state_node);
	gres_node_reconfig(node_ptr->name, entry, &unused, &one,
			   slurm_conf.conf_flags & CONF_FLAG_OR,
			   node_ptr->cores, node_ptr->tot_sockets);
	FREE_NULL_LIST(one);
	gres_ns->gres_cnt_config = keep;	/* if not taken: not in GresTypes */
	xfree(unused);
	xfree(entry);
}

/*
 * Set one GRES total and move the cluster-wide count with it.
 * gres_node_feature() marks the GRES so that registration never checks its
 * count, but leaves "total - allocated" available (made for KNL memory
 * modes), which would count running jobs twice; a runtime
 * "scontrol update node gres=" sets the total itself, and so do we.
 */
extern void k8s_set_total(node_record_t *node_ptr, char *name, uint64_t total)
{
	gres_state_t *gres_state_node;
	gres_node_state_t *gres_ns;
	uint64_t old = 0;

	if ((gres_ns = _gres_ns(node_ptr, name, &gres_state_node)))
		old = gres_ns->gres_cnt_config;
	gres_node_feature(node_ptr->name, name, total, &node_ptr->gres,
			  &node_ptr->gres_list);
	if (!(gres_ns = _gres_ns(node_ptr, name, &gres_state_node)))
		return;		/* not in GresTypes */
	gres_ns->gres_cnt_avail = total;
	_move_cluster_count(node_ptr, name, gres_state_node, total - old);
}
