package subjects

import (
	"fmt"
	"hash/fnv"
	"strconv"
	"strings"
)

// MaxShards is the most shards an installation may be split into.
const MaxShards = 1024

// ShardOf returns the shard, 0 to shards-1, that agent lives on in an
// installation split into shards roots ([ShardRoot]): the FNV-1a hash (32
// bits) of the agent's token ([EncodeToken]) modulo shards. It is the
// number nats-server's subject mapping function {{partition(shards, N)}}
// gives for a subject whose Nth wildcard token is the agent's token, so a
// server-side mapping and a client agree on every agent's shard.
//
// agent must pass [ValidateID] (so not [Broadcast], which lives on every
// shard) and shards must be 1 to [MaxShards]; the error wraps
// [ErrInvalidAgentID] or [ErrInvalidShard].
func ShardOf(agent string, shards int) (int, error) {
	if err := ValidateID(agent); err != nil {
		return 0, err
	}
	if err := validateShards(shards); err != nil {
		return 0, err
	}
	h := fnv.New32a()
	h.Write([]byte(EncodeToken(agent)))
	return int(h.Sum32() % uint32(shards)), nil
}

// ShardRoot returns the root of shard shard of an installation under root
// split into shards: root itself when shards is 1, so that an unsharded
// installation is the one-shard case, and otherwise root followed by
// ".s<shard>", such as "agentbus.s3". Each shard root is an installation of
// its own (streams, buckets, consumers), which [New] builds the scheme of.
//
// The error wraps [ErrInvalidShard] when shard is not in 0..shards-1 or
// shards is not 1 to [MaxShards], and [ErrInvalidRoot] when root is not a
// valid root or the shard root would be longer than a root may be.
func ShardRoot(root string, shard, shards int) (string, error) {
	s, err := New(root)
	if err != nil {
		return "", err
	}
	if err := validateShards(shards); err != nil {
		return "", err
	}
	if shard < 0 || shard >= shards {
		return "", fmt.Errorf("%w: shard %d is not in 0..%d", ErrInvalidShard, shard, shards-1)
	}
	if shards == 1 {
		return s.Root(), nil
	}
	r := s.Root() + "." + shardPrefix + strconv.Itoa(shard)
	if _, err := New(r); err != nil {
		return "", err
	}
	return r, nil
}

// ParseShardRoot returns the root an installation was split from and the
// shard that root is ([ShardRoot] for more than one shard): "agentbus.s3"
// gives "agentbus", 3. ok is false for a root whose last token is not
// "s" and a shard number under [MaxShards] written as ShardRoot writes
// it. An installation's own root may end in such a token too: whether a
// root is one shard of several is what the installation's registry says
// ([InstallationKey]).
func ParseShardRoot(root string) (base string, shard int, ok bool) {
	dot := strings.LastIndexByte(root, '.')
	if dot <= 0 {
		return "", 0, false
	}
	tok := root[dot+1:]
	if len(tok) < 2 || tok[0] != shardPrefix[0] {
		return "", 0, false
	}
	n, err := strconv.Atoi(tok[1:])
	if err != nil || n < 0 || n >= MaxShards || strconv.Itoa(n) != tok[1:] {
		return "", 0, false
	}
	return root[:dot], n, true
}

// shardPrefix starts the token ShardRoot appends to a root.
const shardPrefix = "s"

func validateShards(shards int) error {
	if shards < 1 || shards > MaxShards {
		return fmt.Errorf("%w: %d shards is not 1 to %d", ErrInvalidShard, shards, MaxShards)
	}
	return nil
}
