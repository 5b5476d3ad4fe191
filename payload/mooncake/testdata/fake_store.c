// A stand-in for libmooncake_store.so that the mooncake tests build with
// gcc: it keeps objects in a hash map and can inject every error code, so
// the tests prove the cgo marshalling and the error mapping without a
// Mooncake cluster.
//
// Controls (read on every call):
//   FAKE_MOONCAKE_FAIL="op:code,..."  op in setup put get_into is_exist
//                                     remove register; the call returns code
//   FAKE_MOONCAKE_CORRUPT=1           get_into flips the last byte it copies
//   FAKE_MOONCAKE_LOST=1              put returns 0 without storing
//   FAKE_MOONCAKE_SLOW="op:ms,..."    op (as above) sleeps ms first, as a
//                                     call to a master that is down does
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

typedef struct object {
	char *key;
	unsigned char *data;
	size_t size;
	struct object *next;
} object;

typedef struct region {
	unsigned char *base;
	size_t size;
	struct region *next;
} region;

#define BUCKETS 256

typedef struct {
	pthread_mutex_t mu;
	object *buckets[BUCKETS];
	region *regions;
	int setup_done;
} fake_store;

static unsigned hash(const char *s) {
	unsigned h = 2166136261u;
	while (*s) h = (h ^ (unsigned char)*s++) * 16777619u;
	return h % BUCKETS;
}

// setting returns the number the list in env sets for op, or 0.
static int setting(const char *env, const char *op) {
	const char *spec = getenv(env);
	if (!spec) return 0;
	size_t n = strlen(op);
	for (const char *p = spec; *p;) {
		if (strncmp(p, op, n) == 0 && p[n] == ':') return atoi(p + n + 1);
		p = strchr(p, ',');
		if (!p) break;
		p++;
	}
	return 0;
}

// injected sleeps for what FAKE_MOONCAKE_SLOW sets for op, then returns the
// code FAKE_MOONCAKE_FAIL sets for it, or 0.
static int injected(const char *op) {
	int ms = setting("FAKE_MOONCAKE_SLOW", op);
	if (ms > 0) {
		struct timespec d = {ms / 1000, (long)(ms % 1000) * 1000000L};
		nanosleep(&d, NULL);
	}
	return setting("FAKE_MOONCAKE_FAIL", op);
}

static int flag(const char *name) {
	const char *v = getenv(name);
	return v && strcmp(v, "1") == 0;
}

static object *find(fake_store *s, const char *key) {
	for (object *o = s->buckets[hash(key)]; o; o = o->next)
		if (strcmp(o->key, key) == 0) return o;
	return NULL;
}

void *mooncake_store_create(void) {
	fake_store *s = calloc(1, sizeof *s);
	pthread_mutex_init(&s->mu, NULL);
	return s;
}

void mooncake_store_destroy(void *store) {
	fake_store *s = store;
	for (int i = 0; i < BUCKETS; i++) {
		for (object *o = s->buckets[i]; o;) {
			object *next = o->next;
			free(o->key);
			free(o->data);
			free(o);
			o = next;
		}
	}
	for (region *r = s->regions; r;) {
		region *next = r->next;
		free(r);
		r = next;
	}
	pthread_mutex_destroy(&s->mu);
	free(s);
}

int mooncake_store_setup(void *store, const char *host, const char *meta, uint64_t seg, uint64_t buf,
                         const char *proto, const char *dev, const char *master) {
	(void)host; (void)meta; (void)seg; (void)buf; (void)dev;
	int code = injected("setup");
	if (code) return code;
	if (!proto || !master || !*master) return -1;
	((fake_store *)store)->setup_done = 1;
	return 0;
}

int mooncake_store_put(void *store, const char *key, const void *value, size_t size, const void *cfg) {
	(void)cfg;
	fake_store *s = store;
	int code = injected("put");
	if (code) return code;
	if (!s->setup_done || !key || (!value && size)) return -1;
	if (flag("FAKE_MOONCAKE_LOST")) return 0;
	pthread_mutex_lock(&s->mu);
	if (find(s, key)) { // like Mooncake: a duplicate put succeeds without writing
		pthread_mutex_unlock(&s->mu);
		return 0;
	}
	object *o = calloc(1, sizeof *o);
	o->key = strdup(key);
	o->data = malloc(size ? size : 1);
	memcpy(o->data, value, size);
	o->size = size;
	unsigned h = hash(key);
	o->next = s->buckets[h];
	s->buckets[h] = o;
	pthread_mutex_unlock(&s->mu);
	return 0;
}

static int registered(fake_store *s, void *buf, size_t size) {
	unsigned char *p = buf;
	for (region *r = s->regions; r; r = r->next)
		if (p >= r->base && p + size <= r->base + r->size) return 1;
	return 0;
}

int64_t mooncake_store_get_into(void *store, const char *key, void *buffer, size_t size) {
	fake_store *s = store;
	int code = injected("get_into");
	if (code) return code;
	pthread_mutex_lock(&s->mu);
	if (!registered(s, buffer, size)) { // get_into needs a registered buffer
		pthread_mutex_unlock(&s->mu);
		return -1;
	}
	object *o = find(s, key);
	if (!o) {
		pthread_mutex_unlock(&s->mu);
		return -704;
	}
	if (o->size > size) {
		pthread_mutex_unlock(&s->mu);
		return -1;
	}
	memcpy(buffer, o->data, o->size);
	if (flag("FAKE_MOONCAKE_CORRUPT") && o->size) ((unsigned char *)buffer)[o->size - 1] ^= 1;
	int64_t n = (int64_t)o->size;
	pthread_mutex_unlock(&s->mu);
	return n;
}

int64_t mooncake_store_get_size(void *store, const char *key) {
	fake_store *s = store;
	pthread_mutex_lock(&s->mu);
	object *o = find(s, key);
	int64_t n = o ? (int64_t)o->size : -704;
	pthread_mutex_unlock(&s->mu);
	return n;
}

int mooncake_store_is_exist(void *store, const char *key) {
	fake_store *s = store;
	int code = injected("is_exist");
	if (code) return code;
	pthread_mutex_lock(&s->mu);
	int found = find(s, key) != NULL;
	pthread_mutex_unlock(&s->mu);
	return found;
}

int mooncake_store_remove(void *store, const char *key, int force) {
	(void)force;
	fake_store *s = store;
	int code = injected("remove");
	if (code) return code;
	pthread_mutex_lock(&s->mu);
	object **pp = &s->buckets[hash(key)];
	while (*pp && strcmp((*pp)->key, key) != 0) pp = &(*pp)->next;
	if (!*pp) {
		pthread_mutex_unlock(&s->mu);
		return -704;
	}
	object *o = *pp;
	*pp = o->next;
	free(o->key);
	free(o->data);
	free(o);
	pthread_mutex_unlock(&s->mu);
	return 0;
}

int mooncake_store_register_buffer(void *store, void *buffer, size_t size) {
	fake_store *s = store;
	int code = injected("register");
	if (code) return code;
	region *r = calloc(1, sizeof *r);
	r->base = buffer;
	r->size = size;
	pthread_mutex_lock(&s->mu);
	r->next = s->regions;
	s->regions = r;
	pthread_mutex_unlock(&s->mu);
	return 0;
}

int mooncake_store_unregister_buffer(void *store, void *buffer) {
	fake_store *s = store;
	pthread_mutex_lock(&s->mu);
	for (region **pp = &s->regions; *pp; pp = &(*pp)->next) {
		if ((*pp)->base == buffer) {
			region *r = *pp;
			*pp = r->next;
			free(r);
			break;
		}
	}
	pthread_mutex_unlock(&s->mu);
	return 0;
}
