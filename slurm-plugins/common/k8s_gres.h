/*****************************************************************************\
 *  k8s_gres.h - set a node's k8s GRES totals inside slurmctld.
\*****************************************************************************/

#ifndef _K8S_GRES_H
#define _K8S_GRES_H

#include <stdint.h>

#include "src/common/node_conf.h"

/*
 * Set one GRES total of a node and move the cluster-wide count with it
 * (slurmctld, node write lock held). A GRES not in GresTypes is left alone.
 */
extern void k8s_set_total(node_record_t *node_ptr, char *name, uint64_t total);

#endif
