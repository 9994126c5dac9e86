/* rec_int.h - what store/'s codecs share: string maps as JSON objects. */
#ifndef WARREN_REC_INT_H
#define WARREN_REC_INT_H

#include <jansson.h>

#include "rec.h"

/* m as an object of strings (new reference), NULL when out of memory. */
json_t *rec_kv_json(const struct rec_kv *m);
/* An object's string members into m (others are skipped, as the core never wrote
 * them). 0, -EINVAL (not an object), -ENOMEM. */
int rec_kv_of_json(struct rec_kv *m, json_t *o);

/* {"path","size","mtime_ns","ino"} (new reference), NULL when out of memory. */
json_t *rec_ident_json(const struct sbx_ident *id);
/* o into *id: 0 or -EINVAL. */
int rec_ident_of_json(json_t *o, struct sbx_ident *id);
/* {"internet","allow_out","deny_out","rate_mbit","max_connections"}, each list the
 * comma-separated addresses then names (new reference), NULL when out of memory. */
json_t *rec_net_json(const struct sbx_net_rec *p);
/* o (NULL: absent) into *n: 0 or -ENOMEM. */
int rec_net_of_json(json_t *o, struct rec_net *n);
void rec_net_free(struct rec_net *n);

#endif
